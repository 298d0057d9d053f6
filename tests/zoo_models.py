"""The real models of tests/test_zoo.py (and of docs/torch.md's table): torchvision and
Hugging Face transformers architectures as their libraries build them, random init,
tiny configs, each with its example inputs and a loss as a user would write it.

Each builder returns ``(module, example_inputs, loss_fn, loss_inputs)`` for
:func:`gradtool.interop.torch.import_module`.  torchvision's classifiers return logits
(the loss is ``F.cross_entropy`` with integer labels); a transformers model computes its
own loss from ``labels``, and :class:`HFLoss` passes the inputs by keyword and returns
that loss, as a user's two-line wrapper would.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def cross_entropy(logits, labels):
    return F.cross_entropy(logits, labels)


def _images(n=2, size=32, classes=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 3, size, size, generator=g),), \
        (torch.randint(0, classes, (n,), generator=g),)


def _vision(make, size=32):
    def build():
        torch.manual_seed(0)
        from gradtool.interop.zoo import import_torchvision
        model = make(import_torchvision().models)
        inputs, labels = _images(size=size)
        return model, inputs, cross_entropy, labels
    return build


def _resnet(m):
    from torchvision.models.resnet import BasicBlock
    return m.ResNet(BasicBlock, [1, 1, 1, 1], num_classes=5)


def _efficientnet(m):
    from torchvision.models.efficientnet import MBConvConfig
    setting = [MBConvConfig(1, 3, 1, 8, 8, 1), MBConvConfig(4, 3, 2, 8, 16, 1),
               MBConvConfig(4, 5, 2, 16, 16, 1)]
    return m.EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=5,
                          last_channel=32)


def _mobilenet_v3(m):
    from torchvision.models.mobilenetv3 import InvertedResidualConfig as C
    setting = [C(8, 3, 8, 8, True, "RE", 2, 1, 1.0),      # squeeze-excite (hardsigmoid)
               C(8, 3, 24, 16, False, "RE", 2, 1, 1.0),
               C(16, 5, 32, 16, True, "HS", 1, 1, 1.0)]    # hardswish, a residual
    return m.MobileNetV3(setting, last_channel=32, num_classes=5)


def _convnext(m):
    from torchvision.models.convnext import CNBlockConfig
    return m.ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)],
                      stochastic_depth_prob=0.1, num_classes=5)


VISION = {
    "resnet": _vision(_resnet),
    "mobilenet_v3": _vision(_mobilenet_v3),
    "efficientnet": _vision(_efficientnet),
    "vit": _vision(lambda m: m.VisionTransformer(
        image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16,
        num_classes=5), size=16),
    "squeezenet": _vision(lambda m: m.squeezenet1_1(num_classes=5)),
    "shufflenet_v2": _vision(lambda m: m.ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 32],
                                                      num_classes=5)),
    "densenet": _vision(lambda m: m.DenseNet(growth_rate=4, block_config=(1, 1),
                                             num_init_features=8, bn_size=2,
                                             num_classes=5)),
    "convnext": _vision(_convnext),
}


class HFLoss(nn.Module):
    """A transformers model called by keyword, returning the loss it computes."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, input_ids, attention_mask, labels):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          labels=labels).loss


def _text(vocab=32, n=2, t=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, t), generator=g)
    mask = torch.ones(n, t, dtype=torch.long)
    mask[0, -2:] = 0                           # a padded row
    return ids, mask, g


def _hf(make, labels):
    def build():
        torch.manual_seed(0)
        from gradtool.interop.zoo import import_transformers
        model = make(import_transformers())
        ids, mask, g = _text()
        return HFLoss(model, None), (ids, mask, labels(ids, mask, g)), None, ()
    return build


def _causal_labels(ids, mask, g):
    labels = ids.clone()
    labels[mask == 0] = -100                   # padding ignored, as HF's collators do
    return labels


def _class_labels(ids, mask, g):
    return torch.randint(0, 3, (ids.shape[0],), generator=g)


def _seq2seq_labels(ids, mask, g):
    labels = torch.randint(0, 32, (ids.shape[0], 4), generator=g)
    labels[1, -1] = -100
    return labels


_SMALL = dict(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=16, max_position_embeddings=16)

TEXT = {
    "bert": _hf(lambda t: t.BertForSequenceClassification(t.BertConfig(
        **_SMALL, num_labels=3, type_vocab_size=2)), _class_labels),
    "distilbert": _hf(lambda t: t.DistilBertForSequenceClassification(t.DistilBertConfig(
        vocab_size=32, dim=8, n_layers=1, n_heads=2, hidden_dim=16,
        max_position_embeddings=16, num_labels=3)), _class_labels),
    "gpt2": _hf(lambda t: t.GPT2LMHeadModel(t.GPT2Config(
        vocab_size=32, n_embd=8, n_layer=1, n_head=2, n_positions=16)), _causal_labels),
    "llama": _hf(lambda t: t.LlamaForCausalLM(t.LlamaConfig(
        **_SMALL, num_key_value_heads=1)), _causal_labels),
    "t5": _hf(lambda t: t.T5ForConditionalGeneration(t.T5Config(
        vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_decoder_layers=1,
        num_heads=2, decoder_start_token_id=0)), _seq2seq_labels),
}

MODELS = {**VISION, **TEXT}
