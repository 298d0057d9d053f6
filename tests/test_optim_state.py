"""A saved optimizer state and training position, checked field by field when a run
continues from it: an impossible state is exit 2 with one line naming the field, never
an internal error steps later."""

import math
from pathlib import Path

import msgpack
import pytest
from click.testing import CliRunner

from gradtool.cli import main
from gradtool.optim import OptimizerError
from gradtool.optim_state import check_saved_state, running_power

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
DIGITS = SAMPLES / "digits_mlp.msgpack"
DATA = SAMPLES / "digits.npz"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ck") / "ck.msgpack"
    result = CliRunner().invoke(main, ["train", str(DIGITS), "--data", str(DATA), "--steps",
                                       "7", "--save", str(path)])
    assert result.exit_code == 0, result.output
    return msgpack.unpackb(path.read_bytes())


def edited(doc, tmp_path, edit) -> Path:
    doc = msgpack.unpackb(msgpack.packb(doc, use_bin_type=True))    # a deep copy
    edit(doc["optimizer"], doc["optimizer"]["position"])
    path = tmp_path / "edited.msgpack"
    path.write_bytes(msgpack.packb(doc, use_bin_type=True))
    return path


IMPOSSIBLE = {
    "b2t above 1": (lambda o, p: o.update(b2t=1.5), "'b2t' is 1.5, but after t=7 steps"),
    "b1t = 1/0.9": (lambda o, p: o.update(b1t=1 / 0.9), "'b1t' is 1.1111111111111112"),
    "b1t off by an ulp": (lambda o, p: o.update(b1t=math.nextafter(o["b1t"], 1.0)),
                          "'b1t' is"),
    "b2t negative zero": (lambda o, p: o.update(b2t=-0.0), "'b2t' is -0.0"),
    "t negative": (lambda o, p: o.update(t=-1), "'t' must be an integer >= 0, got -1"),
    "t float": (lambda o, p: o.update(t=7.0), "'t' must be an integer >= 0, got 7.0"),
    "t bool": (lambda o, p: o.update(t=True), "'t' must be an integer"),
    "lr nan": (lambda o, p: o.update(lr=math.nan), "'lr' must be finite and >= 0, got nan"),
    "lr negative": (lambda o, p: o.update(lr=-0.1), "'lr' must be finite and >= 0"),
    "lr string": (lambda o, p: o.update(lr="0.1"), "'lr' must be a number, got '0.1'"),
    "clip inf": (lambda o, p: o.update(clip=math.inf), "'clip' must be finite"),
    "kind unknown": (lambda o, p: o.update(kind="rmsprop"), "'kind' is 'rmsprop'"),
    "params not a list": (lambda o, p: o.update(params={}), "'params' must be a list"),
    "param not a map": (lambda o, p: o["params"].__setitem__(0, 3), "'params[0]' must be a map"),
    "param id negative": (lambda o, p: o["params"][0].update(id=-1), "'params[0].id'"),
    "param id repeated": (lambda o, p: o["params"][1].update(id=o["params"][0]["id"]),
                          "'params[1].id' repeats param node"),
    "param l2 nan": (lambda o, p: o["params"][0].update(l2=math.nan), "'params[0].l2'"),
    "moment not bytes": (lambda o, p: o["params"][0].update(m=[0.0]), "'params[0].m' must be"),
    "moment torn": (lambda o, p: o["params"][0].update(v=o["params"][0]["v"][:-3]),
                    "'params[0].v' must be little-endian float64 bytes"),
    "negative second moment": (lambda o, p: o["params"][1].update(
        v=b"\x00\x00\x00\x00\x00\x00\xf0\xbf" + o["params"][1]["v"][8:]),
        "'params[1].v' holds a negative second moment (-1.0)"),
    "m nan": (lambda o, p: o["params"][0].update(
        m=b"\x00\x00\x00\x00\x00\x00\xf8\x7f" + o["params"][0]["m"][8:]),
        "'params[0].m' holds a non-finite moment (nan)"),
    "v inf": (lambda o, p: o["params"][0].update(
        v=b"\x00\x00\x00\x00\x00\x00\xf0\x7f" + o["params"][0]["v"][8:]),
        "'params[0].v' holds a non-finite moment (inf)"),
    "b1 one": (lambda o, p: o.update(b1=1.0), "'b1' must be in [0, 1), got 1.0"),
    "b2 negative": (lambda o, p: o.update(b2=-0.5), "'b2' must be in [0, 1), got -0.5"),
    "b2 other": (lambda o, p: o.update(b2=0.99), "'b2' is 0.99; gradtool's Adam uses 0.999"),
    "eps zero": (lambda o, p: o.update(eps=0.0), "'eps' must be in > 0, got 0.0"),
    "eps nan": (lambda o, p: o.update(eps=math.nan), "'eps' must be finite"),
    "eps string": (lambda o, p: o.update(eps="1e-8"), "'eps' must be a number"),
    "position not a map": (lambda o, p: o.update(position=[1]), "'position' must be a map"),
    "seed nan": (lambda o, p: p.update(seed=math.nan), "'position.seed' must be an integer "
                                                       ">= 0, got nan"),
    "seed negative": (lambda o, p: p.update(seed=-1), "'position.seed'"),
    "seed float": (lambda o, p: p.update(seed=0.5), "'position.seed'"),
    "shuffle string": (lambda o, p: p.update(shuffle="yes"), "'position.shuffle' must be "
                                                            "true or false"),
    "epoch negative": (lambda o, p: p.update(epoch=-1), "'position.epoch' must be an integer"),
    "step float": (lambda o, p: p.update(step=1.5), "'position.step'"),
    "batch zero": (lambda o, p: p.update(batch=0), "'position.batch' must be an integer >= 1"),
    "global step behind": (lambda o, p: p.update(global_step=1), "'position.global_step' is 1, "
                                                                 "fewer than the 7 steps"),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_an_impossible_saved_state_is_one_line_exit_2(checkpoint, tmp_path, case):
    edit, needle = IMPOSSIBLE[case]
    path = edited(checkpoint, tmp_path, edit)
    result = CliRunner().invoke(main, ["train", str(path), "--data", str(DATA)])
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"gradtool: {path}: saved optimizer state: "), lines[0]
    assert needle in lines[0], (needle, lines[0])


def test_the_written_state_passes_and_resumes(checkpoint, tmp_path):
    position = check_saved_state(checkpoint["optimizer"], "ck")
    assert position["global_step"] == 7 and position["seed"] == 0
    path = edited(checkpoint, tmp_path, lambda o, p: None)
    assert CliRunner().invoke(main, ["train", str(path), "--data", str(DATA), "--steps",
                                     "2"]).exit_code == 0


def test_bias_powers_are_running_products_and_underflow_ends_the_loop():
    value = 1.0
    for _ in range(50):
        value = value * 0.999
    assert running_power(0.999, 50) == value and running_power(0.9, 0) == 1.0
    for base in (0.9, 0.999):             # a subnormal fixed point: the loop ends there
        tiny = running_power(base, 10 ** 18)
        assert 0 < tiny < 1e-300 and tiny * base == tiny
    sgd = {"kind": "sgd", "lr": 0.1, "clip": 0.0, "t": 9, "b1t": 1.0, "b2t": 1.0, "params": []}
    assert check_saved_state(sgd, "s") == {}
    with pytest.raises(OptimizerError, match="'b1t' is 0.9, but after t=9 steps it is 1.0"):
        check_saved_state({**sgd, "b1t": 0.9}, "s")
    with pytest.raises(OptimizerError, match="is list, not a map"):
        check_saved_state([], "s")


# ── the library: Optimizer.load_state_dict runs the same checks ──────────────

def adam_after_steps(steps=3):
    import numpy as np
    import gradtool as gt
    tp = gt.Tape()
    w = tp.param(np.array([0.5, -1.0, 2.0]))
    b = tp.param(np.array([0.25]))
    loss = tp.sum(tp.mul(tp.add(w, b), tp.add(w, b)))
    opt = gt.optim.AdamSeed(0.01)
    for p in (w, b):
        opt.add(tp, p)
    for _ in range(steps):
        tp.backward(loss)
        opt.step(tp)
    return tp, loss, opt


def _moment(value: float, rest: bytes) -> bytes:
    import struct
    return struct.pack("<d", value) + rest[8:]


LIBRARY = {
    "b2t 2.0 (a domain error in step)": (lambda s: s.update(b2t=2.0), "'b2t' is 2.0"),
    "b1t 1/0.9 (a ZeroDivisionError in step)": (lambda s: s.update(b1t=1.1111111111111112),
                                                "'b1t' is 1.1111111111111112"),
    "b1t zero": (lambda s: s.update(b1t=0.0), "'b1t' is 0.0, but after t=3 steps"),
    "b2t of another t": (lambda s: s.update(b2t=running_power(0.999, 4)), "'b2t' is"),
    "b1t nan": (lambda s: s.update(b1t=math.nan), "'b1t' must be finite"),
    "t behind the powers": (lambda s: s.update(t=2), "'b1t' is"),
    "t negative": (lambda s: s.update(t=-1), "'t' must be an integer >= 0"),
    "t string": (lambda s: s.update(t="3"), "'t' must be an integer >= 0"),
    "lr inf": (lambda s: s.update(lr=math.inf), "'lr' must be finite and >= 0"),
    "lr negative": (lambda s: s.update(lr=-1.0), "'lr' must be finite and >= 0"),
    "clip negative": (lambda s: s.update(clip=-1.0), "'clip' must be finite and >= 0"),
    "b1 above 1": (lambda s: s.update(b1=1.5), "'b1' must be in [0, 1), got 1.5"),
    "b1 other": (lambda s: s.update(b1=0.8), "'b1' is 0.8; gradtool's Adam uses 0.9"),
    "b2 one": (lambda s: s.update(b2=1.0), "'b2' must be in [0, 1)"),
    "eps negative": (lambda s: s.update(eps=-1e-8), "'eps' must be in > 0"),
    "eps other": (lambda s: s.update(eps=1e-7), "'eps' is 1e-07"),
    "l2 negative": (lambda s: s["params"][1].update(l2=-0.5), "'params[1].l2' must be finite"),
    "m nan": (lambda s: s["params"][0].update(m=_moment(math.nan, s["params"][0]["m"])),
              "'params[0].m' holds a non-finite moment (nan)"),
    "m -inf": (lambda s: s["params"][1].update(m=_moment(-math.inf, s["params"][1]["m"])),
               "'params[1].m' holds a non-finite moment (-inf)"),
    "v nan": (lambda s: s["params"][0].update(v=_moment(math.nan, s["params"][0]["v"])),
              "'params[0].v' holds a non-finite moment (nan)"),
    "v negative": (lambda s: s["params"][0].update(v=_moment(-2.0, s["params"][0]["v"])),
                   "'params[0].v' holds a negative second moment (-2.0)"),
    "v torn": (lambda s: s["params"][0].update(v=s["params"][0]["v"][:5]),
               "'params[0].v' must be little-endian float64 bytes"),
    "params not a list": (lambda s: s.update(params=3), "'params' must be a list"),
    "kind missing": (lambda s: s.pop("kind"), "optimizer state is for None"),
    "position seed negative": (lambda s: s.update(position={"seed": -2}), "'position.seed'"),
}


@pytest.mark.parametrize("case", sorted(LIBRARY))
def test_load_state_dict_refuses_every_impossible_field(case):
    import numpy as np
    from gradtool.errors import GradtoolError
    tp, loss, opt = adam_after_steps()
    state = msgpack.unpackb(msgpack.packb(opt.state_dict()))
    edit, needle = LIBRARY[case]
    edit(state)
    before = (opt.t, opt.b1t, opt.b2t, opt.lr, [e.m.copy() for e in opt.entries])
    with pytest.raises(GradtoolError) as info:
        opt.load_state_dict(state)
    assert isinstance(info.value, OptimizerError)
    assert needle in str(info.value), (needle, str(info.value))
    after = (opt.t, opt.b1t, opt.b2t, opt.lr, [e.m.copy() for e in opt.entries])
    assert before[:4] == after[:4] and all(np.array_equal(a, b)
                                           for a, b in zip(before[4], after[4]))
    tp.backward(loss)
    opt.step(tp)                          # the optimizer still steps (nothing was half-loaded)


def test_load_state_dict_takes_its_own_state_and_older_ones_without_constants():
    tp, loss, opt = adam_after_steps()
    state = opt.state_dict()
    assert (state["b1"], state["b2"], state["eps"]) == (0.9, 0.999, 1e-8)
    opt.load_state_dict(state)
    for key in ("b1", "b2", "eps"):
        del state[key]
    opt.load_state_dict(state)
    assert opt.t == 3
    sgd = {"kind": "sgd", "lr": 0.1, "clip": 0.0, "t": 0, "b1t": 1.0, "b2t": 1.0,
           "params": [], "b1": 0.9}
    with pytest.raises(OptimizerError, match="'b1' is an adam constant, but the state is sgd"):
        check_saved_state(sgd, None)
