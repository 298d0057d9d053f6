import numpy as np
import pytest

from gradtool import native


def bits(x):
    """The raw IEEE-754 bit patterns of a float64 array (for bit-exact comparisons)."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float64)).view(np.uint64)


def assert_bits_equal(actual, expected, what=""):
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    diff = np.flatnonzero(a.reshape(-1) != e.reshape(-1))
    assert diff.size == 0, (f"{what}: {diff.size} elements differ, first at flat index {diff[0]}: "
                            f"{np.asarray(actual).reshape(-1)[diff[0]]!r} != "
                            f"{np.asarray(expected).reshape(-1)[diff[0]]!r}")


def assert_bits_equal_nan_any(actual, expected, what=""):
    """Bit equality, except that any NaN matches any NaN (payloads and signs are not
    promised: x86 and CUDA make different default NaNs, and which operand's payload a
    NaN + NaN keeps depends on the order a compiler picks)."""
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    both = np.isnan(a) & np.isnan(e)
    assert_bits_equal(np.where(both, 0.0, a), np.where(both, 0.0, e), what)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def threads_restored():
    """The compiled kernels' thread count back to its default after the test."""
    yield
    native.set_num_threads(None)


def require_c_compiler():
    """Skip when this machine has no C compiler (or GRADTOOL_NATIVE=0 turns native code
    off); with one, a native build that fails is the test's failure, not a skip."""
    if not native.enabled():
        pytest.skip("GRADTOOL_NATIVE=0: native code is off")
    try:
        native.compiler()
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))


def pytest_terminal_summary(terminalreporter):
    """Say at the end of every run when the MPI tests skipped, and why (-q hides reasons)."""
    reasons = {str(r.longrepr[2]) for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and "MPI tests skipped" in str(r.longrepr[2])}
    for reason in sorted(reasons):
        terminalreporter.write_line(reason.removeprefix("Skipped: "), yellow=True)
