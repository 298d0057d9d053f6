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
