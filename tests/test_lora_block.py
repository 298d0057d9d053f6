"""The LoRA transformer-block sample (samples/lora_block/): proofs that its gradients are right.

The block is built by the sample's own recording script (imported from its
path, so there is one builder).  Proofs: central finite differences on every
adapter, the PEFT identity at B = 0 bit for bit, an independent float64
PyTorch oracle, 60 Adam steps through `gradtool train` that fit the
sequence, byte-for-byte reproducible files, and the device engine's host
backend giving the CPU bits.  The block's first recording (one-hot
embedding, ones-matmul RMSNorm, slice/concat GQA, log(softmax); kept as
samples/lora_block/legacy/block_onehot.msgpack) still loads and computes the
same loss.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import assert_bits_equal, bits, require_c_compiler
from gradtool.device import capture
from gradtool.gradcheck import fd_check

SAMPLE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "samples", "lora_block")
TAPE_PATH = os.path.join(SAMPLE_DIR, "block.msgpack")
DATA_PATH = os.path.join(SAMPLE_DIR, "tokens.npz")
LEGACY_PATH = os.path.join(SAMPLE_DIR, "legacy", "block_onehot.msgpack")


def _load_script():
    name = "lora_block_record"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(SAMPLE_DIR, "record_block.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module           # dataclasses look their module up here
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def rb():
    return _load_script()


def _loss(block) -> float:
    return float(block.tape.value(block.loss)[0])


def _perturb_b(block, seed=7, scale=0.1):
    """Give every B small random values (at B = 0, dL/dA is zero and an FD check of A is empty)."""
    rng = np.random.default_rng(seed)
    for _, b in block.lora.values():
        block.tape.set_value(b, rng.uniform(-scale, scale, size=b.shape))
    block.tape.forward()


# ── structure ──────────────────────────────────────────────────────────────

def test_only_lora_pairs_are_parameters(rb):
    block = rb.build()
    tp = block.tape
    params = {tp.nodes[p.id].name: tp.value(p).shape for p in tp.params()}
    expected = {}
    for name, (fan_in, fan_out) in rb.PROJECTIONS.items():
        expected[f"{name}.lora_A"] = (fan_in, rb.RANK)
        expected[f"{name}.lora_B"] = (rb.RANK, fan_out)
    assert params == expected
    for _, b in block.lora.values():
        assert_bits_equal(tp.value(b), np.zeros(b.shape), "B starts at +0.0")
    assert [tp.nodes[c.id].name for c in tp.input_slots()] == ["tokens", "targets"]
    assert tp.value(block.logits).shape == (rb.SEQ, rb.VOCAB)


def test_the_block_uses_the_ops_for_models(rb):
    from collections import Counter
    ops = Counter(n.op for n in rb.build().tape.nodes)
    assert ops["take"] == 1 and ops["take_along"] == 1 and ops["log_softmax"] == 1
    assert ops["mean"] == 4                  # three RMSNorm axis means, the loss
    assert ops["bmm"] == 2 and ops["concat"] == 2 and ops["slice"] == 4   # GQA copies nothing
    assert "log" not in ops and "softmax" in ops     # softmax over keys; no log(softmax)
    assert sum(ops.values()) == 139


def test_the_first_recording_still_loads_and_gives_the_same_loss(rb):
    """The one-hot recording, written before integer ids and axis reductions existed,
    loads unchanged; at B = 0 its loss has the same bits as the new block's (the RMSNorm
    row mean by ones-matmul and by axis mean round alike; the two cross-entropies agree
    here), and its adapter gradients agree to rounding."""
    from gradtool.tapefile import load
    old, block = load(LEGACY_PATH), rb.build()
    assert len(old.tape) == 155 and not any(old.tape.holds_ids(i) for i in range(155))
    assert_bits_equal(old.tape.value(old.loss), block.tape.value(block.loss), "loss")
    old.tape.backward(old.loss)
    block.tape.backward(block.loss)
    for p in block.tape.params():
        name = block.tape.nodes[p.id].name
        ours, theirs = np.array(block.tape.grad(p)), np.array(old.tape.grad(old.tape.var(name)))
        assert np.max(np.abs(ours - theirs)) <= 1e-13 * np.max(np.abs(theirs)) or \
            not np.any(theirs), name


def test_rope_tables_are_correctly_rounded(rb):
    mpmath = pytest.importorskip("mpmath")
    cos, sin = rb.rope_tables()
    with mpmath.workprec(200):
        for t in range(rb.SEQ):
            for i in range(rb.HEAD_DIM):
                inv_freq = mpmath.power(rb.ROPE_THETA, mpmath.mpf(-2 * (i % rb.HALF)) / rb.HEAD_DIM)
                assert cos[t, i] == float(mpmath.cos(t * inv_freq)), (t, i)
                assert sin[t, i] == float(mpmath.sin(t * inv_freq)), (t, i)


# ── the shipped files ──────────────────────────────────────────────────────

def test_script_reproduces_the_files_byte_for_byte(tmp_path):
    script = os.path.join(SAMPLE_DIR, "record_block.py")
    subprocess.run([sys.executable, script, str(tmp_path)], check=True, capture_output=True)
    for name in ("block.msgpack", "tokens.npz"):
        with open(os.path.join(SAMPLE_DIR, name), "rb") as f:
            shipped = f.read()
        assert (tmp_path / name).read_bytes() == shipped, f"{name} differs from the shipped file"


def test_shipped_tape_is_the_recorded_block(rb):
    from gradtool.tapefile import load
    shipped = load(TAPE_PATH)
    block = rb.build()
    tp, ref = shipped.tape, block.tape
    assert len(tp) == len(ref)
    assert [n.op for n in tp.nodes] == [n.op for n in ref.nodes]
    assert shipped.loss.id == block.loss.id
    assert shipped.outputs["logits"].id == block.logits.id
    assert shipped.meta["train"] == rb.TRAIN_DEFAULTS
    assert_bits_equal(tp.value(shipped.loss), ref.value(block.loss), "loss")
    tp.backward(shipped.loss)
    ref.backward(block.loss)
    for p, q in zip(tp.params(), ref.params(), strict=True):
        assert tp.nodes[p.id].name == ref.nodes[q.id].name
        assert_bits_equal(tp.grad(p), ref.grad(q), tp.nodes[p.id].name)
    with np.load(DATA_PATH) as data:
        assert sorted(data.files) == ["targets", "tokens"]
        for key, value in rb.training_data().items():
            assert_bits_equal(data[key], value, key)
            assert data[key].shape == tp.value(tp.var(key)).shape


# ── the PEFT identity ──────────────────────────────────────────────────────

def test_peft_identity_at_b_zero_bitwise(rb):
    block = rb.build()
    tp = block.tape
    tp.backward(block.loss)
    for name, (a, b) in block.lora.items():
        assert tp.touched(a), name
        # (x @ A) @ B with B = +0.0: every dL/dA term is a product with +0.0 added
        # into a +0.0 accumulator, so all bits are zero (not even -0.0).
        assert np.all(bits(tp.grad(a)) == 0), f"{name}.lora_A gradient is not all +0.0"
        gb = np.array(tp.grad(b))
        assert np.isfinite(gb).all() and np.count_nonzero(gb) == gb.size, f"{name}.lora_B"


# ── finite differences ─────────────────────────────────────────────────────

def test_finite_differences_on_every_adapter(rb):
    block = rb.build()
    _perturb_b(block)
    report = fd_check(block.tape, block.loss, eps=1e-5, rtol=1e-5, atol=1e-9)
    assert len(report.params) == 2 * len(rb.PROJECTIONS)
    worst = max(p.max_abs_err for p in report.params)
    print(f"\nFD (eps 1e-5, every element of {len(report.params)} adapters): "
          f"worst abs err {worst:.2e}, worst elementwise rel err "
          f"{max(p.max_rel_err for p in report.params):.2e}")
    for p in report.params:
        assert p.passed, (f"{p.name}: analytic {p.analytic!r} vs numeric {p.numeric!r} "
                          f"at {p.worst_index} (abs {p.max_abs_err:.2e}, rel {p.max_rel_err:.2e})")
    # Relative to each adapter's largest gradient, the error is truncation-level.
    tp = block.tape
    normwise = {p.name: p.max_abs_err / float(np.max(np.abs(tp.grad(tp.var(p.id)))))
                for p in report.params}
    print(f"worst error relative to the adapter's largest gradient: "
          f"{max(normwise.values()):.2e}")
    for name, rel in normwise.items():
        assert rel <= 1e-6, (name, rel)


# ── the independent PyTorch oracle ─────────────────────────────────────────

def _torch_block(rb, weights, lora_values, token_ids):
    """The same block written from scratch in PyTorch float64 idioms (nn.Linear
    weight layout, F.embedding, SDPA with GQA and is_causal, F.cross_entropy).
    Returns (loss, {param name: torch leaf with the tape's [in, r] / [r, out] layout})."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    def t(a):
        return torch.tensor(np.asarray(a), dtype=torch.float64)

    leaves = {name: t(v).requires_grad_(True) for name, v in lora_values.items()}
    T, D = rb.SEQ, rb.HEAD_DIM

    def linear(x, name):
        # nn.Linear stores weight [out, in]; the sample stores [in, out].
        bias = weights.get(f"{name}.bias")
        y = F.linear(x, t(weights[f"{name}.weight"]).T, None if bias is None else t(bias))
        lora_a, lora_b = leaves[f"{name}.lora_A"].T, leaves[f"{name}.lora_B"].T
        return y + F.linear(F.linear(x, lora_a), lora_b) * (rb.ALPHA / rb.RANK)

    def rms_norm(x, gain):
        variance = x.pow(2).mean(-1, keepdim=True)
        return t(weights[gain]) * (x * torch.rsqrt(variance + rb.RMS_EPS))

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)

    cos, sin = (t(a) for a in rb.rope_tables())
    ids = torch.tensor(token_ids[:-1])
    targets = torch.tensor(token_ids[1:])

    x = F.embedding(ids, t(weights["embed"]))
    n = rms_norm(x, "input_norm")
    q = linear(n, "q_proj").view(T, rb.N_HEADS, D).transpose(0, 1)
    k = linear(n, "k_proj").view(T, rb.N_KV_HEADS, D).transpose(0, 1)
    v = linear(n, "v_proj").view(T, rb.N_KV_HEADS, D).transpose(0, 1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                          enable_gqa=True)[0]
    h = x + linear(attn.transpose(0, 1).reshape(T, rb.N_HEADS * D), "o_proj")
    n = rms_norm(h, "post_attention_norm")
    h = h + linear(F.silu(linear(n, "gate_proj")) * linear(n, "up_proj"), "down_proj")
    logits = F.linear(rms_norm(h, "final_norm"), t(weights["lm_head"]).T)
    loss = F.cross_entropy(logits, targets)
    loss.backward()
    return loss, leaves


def _rel(a, b) -> float:
    """max |a - b| relative to max |b| (elementwise relative error is meaningless near 0)."""
    scale = float(np.max(np.abs(b)))
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) / scale if scale else 0.0


@pytest.mark.parametrize("b_state", ["b_zero", "b_perturbed"])
def test_torch_float64_oracle(rb, b_state):
    pytest.importorskip("torch")
    block = rb.build()
    if b_state == "b_perturbed":
        _perturb_b(block)
    tp = block.tape
    tp.backward(block.loss)
    lora_values = {tp.nodes[p.id].name: np.array(tp.value(p)) for p in tp.params()}
    loss_t, leaves = _torch_block(rb, rb.init_weights(), lora_values, list(rb.TOKEN_IDS))

    loss_rel = abs(_loss(block) - loss_t.item()) / abs(loss_t.item())
    grad_rel = {}
    for p in tp.params():
        name = tp.nodes[p.id].name
        ours, theirs = np.array(tp.grad(p)), leaves[name].grad.numpy()
        if b_state == "b_zero" and name.endswith("lora_A"):
            assert not np.any(theirs), name          # torch agrees dL/dA = 0 at B = 0
            continue
        grad_rel[name] = _rel(ours, theirs)
    print(f"\ntorch oracle ({b_state}): loss {_loss(block)!r} vs {loss_t.item()!r} "
          f"(rel {loss_rel:.1e}); worst gradient rel {max(grad_rel.values()):.1e}")
    assert loss_rel <= 1e-15
    for name, rel in grad_rel.items():
        assert rel <= 1e-12, (name, rel)


# ── training ───────────────────────────────────────────────────────────────

def _library_adam_losses(rb) -> list:
    """The tape's training defaults driven by gradtool.optim.AdamSeed in memory (the
    meta's "adam", written before the optimizer table, is the seed's Adam): the loss
    before each of the 60 steps, then the loss after the last one."""
    from gradtool.optim import AdamSeed
    block = rb.build()
    tp = block.tape
    opt = AdamSeed(rb.TRAIN_DEFAULTS["lr"])
    for p in tp.params():
        opt.add(tp, p)
    losses = []
    for _ in range(rb.TRAIN_DEFAULTS["epochs"]):   # one example: an epoch is one step
        tp.forward()
        tp.zero_grad()
        tp.backward(block.loss)
        losses.append(_loss(block))
        opt.step(tp)
    tp.forward()
    return losses + [_loss(block)]


def test_sixty_adam_steps_via_gradtool_train(rb, tmp_path):
    from gradtool.tapefile import load
    trained_path = tmp_path / "trained.msgpack"
    proc = subprocess.run(
        [sys.executable, "-c", "from gradtool.cli import main; main()", "train", TAPE_PATH,
         "--data", DATA_PATH, "--save", str(trained_path), "--json"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 60                   # the tape's meta defaults

    trained = load(trained_path)
    final = float(trained.tape.value(trained.loss)[0])
    library = _library_adam_losses(rb)
    print(f"\n60 Adam steps via gradtool train: loss {library[0]!r} -> {final!r}")
    # The shell run and the in-memory run agree to the bit: last step's loss, final loss.
    assert summary["final_loss"] == library[59]
    assert final == library[60]
    for name, (_, b) in rb.build().lora.items():
        assert np.count_nonzero(trained.tape.value(trained.tape.var(f"{name}.lora_B")))
    assert np.isfinite(library).all()
    assert final < 0.1 * library[0]


# ── device replay ──────────────────────────────────────────────────────────

def _host_replay(block):
    require_c_compiler()
    return capture(block.tape, block.loss, backend="host")


@pytest.mark.parametrize("b_state", ["b_zero", "b_perturbed"])
def test_host_backend_gives_the_cpu_bits(rb, b_state):
    block = rb.build()
    if b_state == "b_perturbed":
        _perturb_b(block)
    tp = block.tape
    tp.backward(block.loss)
    replay = _host_replay(block)
    replay.forward()
    replay.backward()
    assert_bits_equal(np.array([replay.loss()]), tp.value(block.loss), "loss")
    assert_bits_equal(replay.value(block.logits.id), tp.value(block.logits), "logits")
    for p in tp.params():
        assert_bits_equal(replay.grad(p.id), tp.grad(p), tp.nodes[p.id].name)


def test_gradtool_train_on_the_host_backend_gives_the_cpu_bits(rb, tmp_path):
    require_c_compiler()
    from gradtool.tapefile import load
    outs = {}
    for backend in ("cpu", "host"):
        outs[backend] = tmp_path / f"{backend}.msgpack"
        proc = subprocess.run(
            [sys.executable, "-c", "from gradtool.cli import main; main()", "train", TAPE_PATH,
             "--data", DATA_PATH, "--backend", backend, "--save", str(outs[backend])],
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    cpu, host = load(outs["cpu"]), load(outs["host"])
    for p, q in zip(cpu.tape.params(), host.tape.params(), strict=True):
        assert_bits_equal(host.tape.value(q), cpu.tape.value(p), cpu.tape.nodes[p.id].name)


def test_replay_gpu_check_on_the_host_backend():
    require_c_compiler()
    from click.testing import CliRunner
    from gradtool.cli import main
    result = CliRunner().invoke(main, ["replay-gpu", TAPE_PATH, "--backend", "host", "--check"])
    assert result.exit_code == 0, result.output
