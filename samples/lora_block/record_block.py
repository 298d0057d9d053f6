"""Record one Qwen2-style decoder block with LoRA adapters as a gradtool tape.

    python samples/lora_block/record_block.py     # writes block.msgpack + tokens.npz here

The block is the whole of a (one-layer) Qwen2 causal language model on one
short token sequence, written with gradtool's ops and its building blocks
(``gradtool.nn``), which record nothing but ops:

    take(embedding, tokens)                           -> x        [T, H]
    h = x + o_proj(attention(rope(q, k), v))          (input RMSNorm first)
    h = h + down_proj(silu(gate_proj(n)) * up_proj(n))  (post-attention RMSNorm n)
    logits = RMSNorm(h) @ lm_head                               [T, V]
    loss = softmax_cross_entropy(logits, targets)  = -mean(log_softmax(logits)[target])

RMSNorm is an axis mean; grouped-query attention reshapes the query heads
that share a kv head into that head's batch of one ``bmm`` (no copies).

Every base weight is a frozen const.  The ONLY parameters are LoRA pairs
(A [in, r], B [r, out]) on q, k, v, o, gate, up and down, added as PEFT does:
``base(x) + (x @ A) @ B * alpha/r``, with B initialised to zero so that the
adapted model starts out exactly equal to the base model.

The two named consts are the training input slots, integer ids (dtype i64):
``tokens`` [1, T] and ``targets`` [1, T, 1] (one example = one sequence;
position t's target is token t + 1).  ``tokens.npz`` holds the one fixed
sequence, so

    gradtool train samples/lora_block/block.msgpack --data samples/lora_block/tokens.npz

takes one Adam step per epoch on it.  Every number below (weights, rotary
tables, file bytes) is computed without the platform's libm, so re-running
this script reproduces both files byte for byte on any machine.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from decimal import Decimal, localcontext

import numpy as np

from gradtool import nn
from gradtool.npzio import write_npz
from gradtool.tape import GVar, Tape
from gradtool.tapefile import save

# ── sizes (a tiny Qwen2) ───────────────────────────────────────────────────
VOCAB = 50
HIDDEN = 32
N_HEADS = 4                       # query heads
N_KV_HEADS = 2                    # key/value heads (grouped-query attention)
GROUP = N_HEADS // N_KV_HEADS     # query heads served by one kv head
HEAD_DIM = HIDDEN // N_HEADS      # 8
HALF = HEAD_DIM // 2
INTERMEDIATE = 64                 # SwiGLU width
SEQ = 8                           # positions per sequence
RANK = 4                          # LoRA rank r
ALPHA = 8.0                       # LoRA alpha; the adapter output is scaled by alpha / r
SCALING = ALPHA / RANK            # 2.0, exact
RMS_EPS = 1e-6                    # Qwen2's rms_norm_eps
ROPE_THETA = 10000.0
MASK_VALUE = -1e9                 # added above the diagonal: exp() of it is exactly 0
SEED = 20240607

# The fixed training sequence: SEQ + 1 token ids; position t predicts token t + 1.
TOKEN_IDS = (7, 23, 41, 3, 18, 35, 12, 29, 46)

# The seven adapted projections: name -> (in features, out features).
PROJECTIONS = {
    "q_proj": (HIDDEN, N_HEADS * HEAD_DIM),
    "k_proj": (HIDDEN, N_KV_HEADS * HEAD_DIM),
    "v_proj": (HIDDEN, N_KV_HEADS * HEAD_DIM),
    "o_proj": (N_HEADS * HEAD_DIM, HIDDEN),
    "gate_proj": (HIDDEN, INTERMEDIATE),
    "up_proj": (HIDDEN, INTERMEDIATE),
    "down_proj": (INTERMEDIATE, HIDDEN),
}

# Training defaults stored in the tape's meta (read by `gradtool train`).
TRAIN_DEFAULTS = {"optimizer": "adam", "lr": 0.005, "epochs": 60, "shuffle": False}


# ── frozen weights, rotary tables, data ────────────────────────────────────

def init_weights(seed: int = SEED) -> dict:
    """Base weights (frozen) and the LoRA A initialisations, keyed by name.

    Every matrix is stored [in, out] so the block computes ``x @ W`` (torch's
    nn.Linear stores the transpose).  Values are uniform draws, PEFT-style:
    bound 1/sqrt(fan_in) like nn.Linear and LoRA A's kaiming-uniform init.
    Generator.uniform is ``low + (high - low) * u`` on an exact 53-bit u:
    no libm, the same bits everywhere.
    """
    rng = np.random.default_rng(seed)

    def uniform(bound, *shape):
        return rng.uniform(-bound, bound, size=shape)

    w = {"embed": uniform(1.0, VOCAB, HIDDEN),
         "input_norm": 1.0 + uniform(0.1, HIDDEN),
         "post_attention_norm": 1.0 + uniform(0.1, HIDDEN),
         "final_norm": 1.0 + uniform(0.1, HIDDEN)}
    for name, (fan_in, fan_out) in PROJECTIONS.items():
        w[f"{name}.weight"] = uniform(1.0 / math.sqrt(fan_in), fan_in, fan_out)
        if name in ("q_proj", "k_proj", "v_proj"):          # Qwen2: biases on q, k, v only
            w[f"{name}.bias"] = uniform(1.0 / math.sqrt(fan_in), fan_out)
    # A head twice nn.Linear's width: with 1/sqrt(H), the RMS-normalised features
    # can only reach small logits and the loss of a perfectly fitted sequence
    # stays above 1; this head lets the adapters drive it well below that.
    w["lm_head"] = uniform(2.0 / math.sqrt(HIDDEN), HIDDEN, VOCAB)
    for name, (fan_in, _) in PROJECTIONS.items():
        w[f"{name}.lora_A"] = uniform(1.0 / math.sqrt(fan_in), fan_in, RANK)
    return w


def _cos_sin(x: Decimal) -> tuple:
    """cos(x), sin(x) by their Taylor series in the current decimal context."""
    cos, sin, term = Decimal(0), Decimal(0), Decimal(1)        # term = x**n / n!
    for n in range(120):                                       # |x| < SEQ: ample
        if n % 4 == 0:
            cos += term
        elif n % 4 == 1:
            sin += term
        elif n % 4 == 2:
            cos -= term
        else:
            sin -= term
        term = term * x / (n + 1)
    return cos, sin


def rope_tables() -> tuple:
    """Qwen2's rotary cos/sin tables, [SEQ, HEAD_DIM] each.

    angle[t, i] = t * theta**(-2i / HEAD_DIM) for i < HALF, columns repeated
    (``emb = cat(freqs, freqs)``).  Computed in 40-digit decimal arithmetic
    and rounded once to float64, so the bits do not depend on a libm.
    """
    cos = np.empty((SEQ, HEAD_DIM))
    sin = np.empty((SEQ, HEAD_DIM))
    with localcontext() as ctx:
        ctx.prec = 40
        for i in range(HALF):
            inv_freq = Decimal(ROPE_THETA) ** (Decimal(-2 * i) / Decimal(HEAD_DIM))
            for t in range(SEQ):
                c, s = _cos_sin(t * inv_freq)
                cos[t, i] = cos[t, i + HALF] = float(c)
                sin[t, i] = sin[t, i + HALF] = float(s)
    return cos, sin


def causal_mask() -> np.ndarray:
    """[SEQ, SEQ]: 0 where key <= query, MASK_VALUE above the diagonal."""
    return np.triu(np.full((SEQ, SEQ), MASK_VALUE), k=1)


def training_data(token_ids=TOKEN_IDS) -> dict:
    """The input slots for one sequence, as int64 ids: next-token prediction, one example."""
    ids = np.array(token_ids, dtype=np.int64)
    return {"tokens": ids[None, :-1].copy(), "targets": ids[None, 1:, None].copy()}


# ── the block, op by op ────────────────────────────────────────────────────

@dataclass
class Block:
    tape: Tape
    loss: GVar
    logits: GVar
    lora: dict            # projection name -> (A, B) param GVars


def record(weights: dict, data: dict) -> Block:
    """Record the block on a fresh tape and return its handles."""
    tp = Tape()
    lora = {}

    # Input slots: token ids [1, T] and next-token target ids [1, T, 1].
    tokens = tp.const(data["tokens"], name="tokens", dtype="i64")
    targets = tp.const(data["targets"], name="targets", dtype="i64")

    # Shared frozen tables.
    cos_np, sin_np = rope_tables()
    cos, sin = tp.const(cos_np), tp.const(sin_np)
    mask = tp.const(causal_mask())

    def rms_norm(x, gain):
        # x / sqrt(mean(x^2) + eps) * gain, the mean along the hidden axis.
        return nn.rms_norm(x, tp.const(weights[gain]), eps=RMS_EPS)

    def projection(x, name):
        # PEFT LoRA: frozen base(x) + (x @ A) @ B * alpha/r; B starts at zero.
        fan_in, fan_out = PROJECTIONS[name]
        bias = weights.get(f"{name}.bias")                            # q, k, v only
        y = nn.linear(x, tp.const(weights[f"{name}.weight"]),
                      None if bias is None else tp.const(bias))       # broadcast over rows
        a = tp.param(weights[f"{name}.lora_A"], name=f"{name}.lora_A")
        b = tp.param(np.zeros((RANK, fan_out)), name=f"{name}.lora_B")
        lora[name] = (a, b)
        return y + ((x @ a) @ b) * SCALING

    def split_heads(x, heads):
        # [T, heads*D] -> [heads, T, D]: transpose, cut the rows into heads, transpose back.
        return tp.transpose(tp.reshape(tp.transpose(x), [heads, HEAD_DIM, SEQ]))

    def merge_heads(x, heads):
        # [heads, T, D] -> [T, heads*D], the inverse of split_heads.
        return tp.transpose(tp.reshape(tp.transpose(x), [heads * HEAD_DIM, SEQ]))

    def rotate_half(x):
        # cat(-x2, x1) over the last axis, x1/x2 the two halves of each head.
        heads = x.shape[0]
        x1 = tp.slice(x, [0, 0, 0], [heads, SEQ, HALF])
        x2 = tp.slice(x, [0, 0, HALF], [heads, SEQ, HEAD_DIM])
        return tp.concat(-x2, x1, axis=2)

    def rotary(x):
        # x * cos + rotate_half(x) * sin, the [T, D] tables broadcast over heads.
        return x * cos + rotate_half(x) * sin

    def by_kv_head(x, rows):
        # [H, T, n] <-> [KV, GROUP*T, n]: kv head j serves query heads j*GROUP ..
        # j*GROUP+GROUP-1, which are adjacent, so grouping them is a reshape (no copy).
        return tp.reshape(x, [N_KV_HEADS, GROUP * SEQ, rows] if x.shape[0] == N_HEADS
                          else [N_HEADS, SEQ, rows])

    # Embedding lookup: the token ids pick rows of the table.
    x = tp.reshape(tp.take(tp.const(weights["embed"]), tokens), [SEQ, HIDDEN])

    # Self-attention sub-block (pre-norm, grouped-query, rotary, causal).
    n = rms_norm(x, "input_norm")
    q = rotary(split_heads(projection(n, "q_proj"), N_HEADS))         # [4, T, 8]
    k = rotary(split_heads(projection(n, "k_proj"), N_KV_HEADS))      # [2, T, 8]
    v = split_heads(projection(n, "v_proj"), N_KV_HEADS)              # [2, T, 8]
    # grouped-query attention: each kv head's batch holds its GROUP query heads' rows
    scores = by_kv_head(by_kv_head(q, HEAD_DIM) @ tp.transpose(k), SEQ)   # [4, T, T]
    probs = tp.softmax(scores * (1.0 / math.sqrt(HEAD_DIM)) + mask, axis=2)   # over keys
    context = merge_heads(by_kv_head(by_kv_head(probs, SEQ) @ v, HEAD_DIM), N_HEADS)
    h = x + projection(context, "o_proj")                             # residual

    # SwiGLU MLP sub-block: down(silu(gate(n)) * up(n)).
    n = rms_norm(h, "post_attention_norm")
    h = h + projection(nn.silu(projection(n, "gate_proj")) * projection(n, "up_proj"),
                       "down_proj")                                   # residual

    # Final norm and LM head.
    logits = rms_norm(h, "final_norm") @ tp.const(weights["lm_head"])  # [T, V]

    # Cross-entropy: -mean over positions of log_softmax(logits)[target].
    loss = nn.softmax_cross_entropy(tp.reshape(logits, [1, SEQ, VOCAB]), targets)
    return Block(tp, loss, logits, lora)


def build() -> Block:
    """The block as shipped: seeded weights, B = 0, the fixed sequence."""
    return record(init_weights(), training_data())


def meta() -> dict:
    return {
        "producer": "samples/lora_block/record_block.py",
        "description": "Qwen2-style decoder block (GQA, rotary, SwiGLU, RMSNorm) with "
                       "LoRA adapters on q,k,v,o,gate,up,down; next-token cross-entropy",
        "config": {"vocab": VOCAB, "hidden": HIDDEN, "heads": N_HEADS,
                   "kv_heads": N_KV_HEADS, "head_dim": HEAD_DIM,
                   "intermediate": INTERMEDIATE, "seq": SEQ, "rank": RANK,
                   "alpha": ALPHA, "rms_eps": RMS_EPS, "rope_theta": ROPE_THETA,
                   "seed": SEED},
        "token_ids": list(TOKEN_IDS),
        "train": dict(TRAIN_DEFAULTS),
    }


# ── files ──────────────────────────────────────────────────────────────────

def main(out_dir: str) -> None:
    block = build()
    tape_path = os.path.join(out_dir, "block.msgpack")
    data_path = os.path.join(out_dir, "tokens.npz")
    save(block.tape, tape_path, loss=block.loss, outputs={"logits": block.logits}, meta=meta())
    write_npz(data_path, training_data())
    loss = float(block.tape.value(block.loss)[0])
    print(f"wrote {tape_path} ({len(block.tape)} nodes, loss {loss!r} at B = 0) and {data_path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
