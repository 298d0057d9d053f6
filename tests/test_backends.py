"""The device backend registry (gradtool/device/backends.py): a backend is one module plus
one register() line, and the CLI, training, replay and `auto` find it there.

The toy backend is the host backend's class registered under another name, the way
docs/device.md ("Adding a backend") shows: everything above the registry must treat it
like host, to the same bytes."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

import gradtool as gt
from conftest import assert_bits_equal
from gradtool.cli import main
from gradtool.device import backends, capture
from gradtool.device.cuda import cuda_status
from gradtool.device.host import HostBackend
from gradtool.errors import GradtoolError
from gradtool.optim import Adam
from gradtool.tapefile import load
from gradtool.train import TrainError, make_engine
from gradtool.train.engines import engine_names
from support import DIGITS, DIGITS_DATA, SAMPLES, assert_one_line_error

LOGISTIC = SAMPLES / "logistic.msgpack"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def toyhost():
    """HostBackend registered as "toyhost" (the one registry line of a new backend)."""
    backends.register("toyhost", HostBackend.create, about="the host backend, renamed",
                      zero_fills="each")
    yield "toyhost"
    backends.unregister("toyhost")


def test_the_built_in_backends_and_what_commands_offer():
    assert backends.names() == ("host", "cuda")
    assert backends.choices() == ("host", "cuda", "auto")
    assert engine_names() == ("cpu", "host", "cuda", "auto")
    for name in backends.names():
        assert backends.get(name).about


def test_a_registered_backend_is_offered_everywhere_and_gone_after_unregister(toyhost):
    assert backends.names()[-1] == "toyhost"
    assert backends.choices()[-2:] == ("toyhost", "auto")
    assert "toyhost" in engine_names()
    for command in ("train", "replay-gpu"):
        result = run(command, "--help")
        assert result.exit_code == 0 and "toyhost" in result.stdout, result.output
    backends.unregister("toyhost")
    try:
        result = run("replay-gpu", LOGISTIC, "--backend", "toyhost")
        assert result.exit_code == 2 and "toyhost" in result.stderr, result.output
        with pytest.raises(TrainError, match="unknown backend 'toyhost'"):
            make_engine("toyhost", None, 0, None)
    finally:
        backends.register("toyhost", HostBackend.create)     # the fixture unregisters it
    with pytest.raises(GradtoolError, match="zero_fills must be 'ahead' or 'each'"):
        backends.register("toyfill", HostBackend.create, zero_fills="later")


def _episodes(tf, backend: str, steps: int = 4):
    """``steps`` Adam episodes of a sample on ``backend``: (losses, params, grads)."""
    tp = tf.tape
    opt = Adam(0.01)
    for p in tp.params():
        opt.add(tp, p)
    rp = capture(tp, tf.loss.id, backend, optimizer=opt)
    losses = [rp.episode(train=True) for _ in range(steps)]
    rp.forward()
    rp.backward()
    return rp, np.array(losses), [rp.value(p) for p in tp.params()], \
        [rp.grad(p) for p in tp.params()]


def test_the_toy_backend_replays_to_the_bits_of_host(toyhost):
    toy, *toy_run = _episodes(load(LOGISTIC), toyhost)
    host, *host_run = _episodes(load(LOGISTIC), "host")
    assert (toy.backend, toy.backend_reason, toy.dev.name) == ("toyhost", "requested", "toyhost")
    assert host.dev.name == "host"
    assert isinstance(toy.dev, backends.Backend) and isinstance(host.dev, backends.Backend)
    assert not np.array_equal(toy_run[1][0], load(LOGISTIC).tape.values[
        load(LOGISTIC).tape.params()[0].id]), "the episodes changed nothing"
    for got, want in zip(toy_run, host_run):
        for a, b in zip(got, want):
            assert_bits_equal(a, b, "toyhost vs host")


def test_replay_gpu_and_train_through_the_registry_give_hosts_bytes(toyhost, tmp_path):
    reports = {}
    for backend in ("host", toyhost):
        result = run("replay-gpu", LOGISTIC, "--backend", backend, "--check", "--train", "adam",
                     "--episodes", "3", "--warmup", "1", "--json")
        assert result.exit_code == 0, result.output
        reports[backend] = json.loads(result.stdout)
    assert reports[toyhost]["backend"] == toyhost
    assert reports[toyhost]["check"]["ok"] is True and reports[toyhost]["check"]["max_ulps"] == 0
    assert reports[toyhost]["graph"] is None
    for key in ("loss_first", "loss_last", "launches", "device_bytes"):
        assert reports[toyhost][key] == reports["host"][key], key
    # registered to zero the gradients ahead (one fill, as cuda): other launches, same bits
    backends.register("toyahead", HostBackend.create)
    try:
        result = run("replay-gpu", LOGISTIC, "--backend", "toyahead", "--check", "--train",
                     "adam", "--episodes", "3", "--warmup", "1", "--json")
    finally:
        backends.unregister("toyahead")
    assert result.exit_code == 0, result.output
    ahead = json.loads(result.stdout)
    assert ahead["check"]["ok"] is True and ahead["check"]["max_ulps"] == 0
    assert (ahead["loss_first"], ahead["loss_last"]) == (reports["host"]["loss_first"],
                                                         reports["host"]["loss_last"])
    assert ahead["launches"] != reports["host"]["launches"]

    saved = {}
    for backend in ("cpu", "host", toyhost):
        out = tmp_path / f"{backend}.msgpack"
        result = run("train", DIGITS, "--data", DIGITS_DATA, "--steps", 5, "--backend", backend,
                     "--save", out)
        assert result.exit_code == 0, result.output
        saved[backend] = out.read_bytes()
    assert saved[toyhost] == saved["host"] == saved["cpu"]
    assert saved["cpu"] != DIGITS.read_bytes()


def test_auto_takes_the_highest_ranked_usable_backend_and_says_what_it_passed_over():
    gpu = cuda_status()[0]
    name, why = backends.resolve("auto")
    assert name == ("cuda" if gpu else "host") and why.startswith("auto: ")
    backends.register("nodev", HostBackend.create, available=lambda: (False, "no such device"),
                      auto=9)
    try:
        name, why = backends.resolve("auto")
        assert name == ("cuda" if gpu else "host")
        assert why.startswith("auto: no nodev (no such device)")
        with pytest.raises(GradtoolError, match="the nodev backend is unavailable: no such device"):
            backends.resolve("nodev")
        assert_one_line_error(run("replay-gpu", LOGISTIC, "--backend", "nodev"), 2,
                              "nodev backend is unavailable")
    finally:
        backends.unregister("nodev")


def test_an_unranked_backend_is_never_picked_by_auto(toyhost):
    assert backends.get(toyhost).auto == 0
    assert backends.resolve("auto")[0] != toyhost


def test_a_factory_named_by_a_string_is_imported_on_first_use():
    backends.register("lazyhost", "gradtool.device.host:HostBackend.create",
                      available="gradtool.device.cuda:cuda_status")
    try:
        assert backends.get("lazyhost").status() == cuda_status()
    finally:
        backends.unregister("lazyhost")
    backends.register("lazyhost", "gradtool.device.host:HostBackend.create")
    try:
        tp = gt.Tape()
        w = tp.param(np.array([0.5, -2.0]))
        loss = tp.sum(w * w)
        rp = capture(tp, loss, "lazyhost")
        rp.forward()
        rp.backward()
        assert rp.dev.name == "lazyhost" and type(rp.dev) is HostBackend
        assert rp.loss() == 4.25
        assert_bits_equal(rp.grad(w), np.array([1.0, -4.0]), "grad")
    finally:
        backends.unregister("lazyhost")


@pytest.mark.parametrize("name", ["auto", "", "two words", "1x", None])
def test_register_refuses_a_name_that_is_not_an_identifier_or_is_auto(name):
    with pytest.raises(GradtoolError, match="backend name"):
        backends.register(name, HostBackend.create)


def test_register_refuses_a_taken_name_unless_replace(toyhost):
    with pytest.raises(GradtoolError, match="already registered"):
        backends.register("host", HostBackend.create)
    with pytest.raises(GradtoolError, match="already registered"):
        backends.register(toyhost, HostBackend.create)
    backends.register(toyhost, HostBackend.create, about="again", replace=True)
    assert backends.get(toyhost).about == "again"
    with pytest.raises(GradtoolError, match="callable"):
        backends.register("bad", 42)
    with pytest.raises(GradtoolError, match="no backend named 'bad'"):
        backends.unregister("bad")


def test_an_unknown_name_lists_the_registry():
    with pytest.raises(GradtoolError, match=r"unknown backend 'tpu' \(choose from host, cuda, auto\)"):
        backends.get("tpu")
    with pytest.raises(GradtoolError, match="unknown backend 'tpu'"):
        backends.resolve("tpu")


def test_mpi_ranks_select_their_device_through_the_registry():
    """train/distributed.select_gpu asks the backend (its select_device hook), for the
    named backend, or for every backend `auto` may pick; cpu and one process select
    nothing."""
    from types import SimpleNamespace

    from gradtool.train.distributed import select_gpu

    seen = []
    backends.register("rankdev", HostBackend.create, select_device=lambda r: seen.append(r),
                      auto=1)
    backends.register("quiet", HostBackend.create, select_device=lambda r: seen.append(-r))
    try:
        select_gpu(SimpleNamespace(size=4, local_rank=3), "rankdev")
        assert seen == [3]
        select_gpu(SimpleNamespace(size=4, local_rank=2), "auto")    # quiet: not auto's
        assert seen == [3, 2]
        select_gpu(SimpleNamespace(size=4, local_rank=1), "quiet")
        assert seen == [3, 2, -1]
        for world, name in [(SimpleNamespace(size=1, local_rank=0), "rankdev"),
                            (SimpleNamespace(size=4, local_rank=1), "cpu"),
                            (SimpleNamespace(size=4, local_rank=1), "nonesuch")]:
            select_gpu(world, name)
        assert seen == [3, 2, -1]
    finally:
        backends.unregister("rankdev")
        backends.unregister("quiet")
