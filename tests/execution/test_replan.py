"""A run on one rank that finds the GPU short of room mid-run (another
process took memory after planning: summa.DeviceMemoryError, faked here on
NumPy's device by a GEMM that fails) gives back what it held, is planned
again with the memory free then and run once more, with one RuntimeWarning;
a second failure is the one clear DeviceMemoryError, saying where `out=`
may be partly written."""

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import summa
from summa.api.multiply import matmul_arrays
from summa.device.account import DeviceMemoryError
from summa.device.backend import cupy_available
from summa.device.numpy_backend import NumpyBackend

SHORT = "GPU 0 has no room for 1.0 MiB more: the multiply held 2.0 MiB of the 3.0 MiB it " \
    "planned; another process may have taken memory since it was planned"


@pytest.fixture
def failing(monkeypatch):
    """Make NumPy's GEMM fail as the account does where the GPU has no room,
    its first `times` calls (None: every one), after scribbling NaN over the
    C it was to write (what a run cut short leaves there)."""
    gemm, calls = NumpyBackend.gemm, {"n": 0, "times": None}

    def short(self, alpha, a, b, c, *args, **kwargs):
        calls["n"] += 1
        if calls["times"] is None or calls["n"] <= calls["times"]:
            c[...] = np.nan
            raise DeviceMemoryError(SHORT)
        return gemm(self, alpha, a, b, c, *args, **kwargs)
    monkeypatch.setattr(NumpyBackend, "gemm", short)

    def fail(times):
        calls["times"] = times
    return fail


def _operands(dtype=np.float64):
    rng = np.random.default_rng(7)
    return rng.random((300, 200)).astype(dtype), rng.random((200, 250)).astype(dtype)


def _product(how: str, a, b, out):
    kw = dict(comm=MPI.COMM_SELF, backend="numpy", panel_width=64)
    if how == "out of core":
        kw.update(out_of_core=True, device_memory="1MiB")
    if how == "Matmul":
        return summa.Matmul(a, b, **kw).execute(out=out)
    return matmul_arrays(a, b, out=out, **kw)


def _planned_again(caught) -> list:
    return [w for w in caught if issubclass(w.category, RuntimeWarning)
            and "planned again" in str(w.message)]


@pytest.mark.parametrize("how", ["matmul", "Matmul", "out of core"])
@pytest.mark.parametrize("given_out", [False, True])
def test_a_run_short_of_room_is_planned_again_and_run_once_more(failing, monkeypatch, how,
                                                                given_out):
    from summa.api import multiply
    from summa.execution import arrays
    a, b = _operands()
    out = np.full((300, 250), -1.0) if given_out else None
    failing(1)
    planned = []
    for module in (multiply, arrays):  # summa.matmul's planner, and a Matmul's

        def counted(*args, _plan=module.plan_held, **kwargs):
            planned.append(args)
            return _plan(*args, **kwargs)
        monkeypatch.setattr(module, "plan_held", counted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = _product(how, a, b, out)
    said = _planned_again(caught)
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "no room for 1.0 MiB more" in str(said[0].message)
    assert "another process" not in str(said[0].message)
    assert c is out if given_out else isinstance(c, np.ndarray)
    assert len(planned) == 1  # planned again, with the memory free then
    # the second run wrote the whole product over the first's NaN
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-12)


@pytest.mark.parametrize("how", ["matmul", "Matmul", "out of core"])
@pytest.mark.parametrize("given_out", [False, True])
def test_a_run_short_of_room_twice_is_one_clear_error(failing, how, given_out):
    a, b = _operands()
    out = np.zeros((300, 250)) if given_out else None
    failing(None)
    with warnings.catch_warnings(record=True) as caught, \
            pytest.raises(DeviceMemoryError) as raised:
        warnings.simplefilter("always")
        _product(how, a, b, out)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("GPU 0 has no room for 1.0 MiB more")
    assert message.endswith("; out= may be partly written") == given_out, message
    assert message.count("out=") == int(given_out)
    assert len(_planned_again(caught)) == 1  # planned again once, never a third run


def test_a_plan_nothing_fits_any_more_is_the_same_error_with_the_planners_reason(
        failing, monkeypatch):
    """Where planning again refuses (nothing fits the memory free now): the
    DeviceMemoryError, with the planner's reason, `out=` said last."""
    from summa.api import multiply
    a, b = _operands()
    failing(1)

    def refused(*args, **kwargs):
        raise ValueError("device_memory 1.0 MiB holds no plan")
    monkeypatch.setattr(multiply, "plan_held", refused)
    with pytest.raises(DeviceMemoryError) as raised:
        _product("matmul", a, b, np.zeros((300, 250)))
    message = str(raised.value)
    assert "; planned again: device_memory 1.0 MiB holds no plan" in message
    assert message.endswith("; out= may be partly written"), message


@pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")
@pytest.mark.parametrize("where", ["cupy operands", "numpy operands"])
def test_a_gpu_short_of_room_mid_run_plans_again_on_the_gpu(monkeypatch, where):
    """On a GPU: the first GEMM's draw finds no room (a draw larger than the
    card, through the account's allocator, as memory another process took
    would), the pool gives back its blocks, and the product planned again
    is right, written into `out` where it lies."""
    import cupy
    from summa.device.cupy_backend import CupyBackend
    gemm, calls = CupyBackend.gemm, []

    def short(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # (more than the card holds: CuPy's OutOfMemoryError, then summa's)
            self.xp.empty(2 * self.memory_total(), dtype=np.uint8)
        return gemm(self, *args, **kwargs)
    monkeypatch.setattr(CupyBackend, "gemm", short)
    a, b = _operands()
    xp = cupy if where == "cupy operands" else np
    a, b = xp.asarray(a), xp.asarray(b)
    out = xp.zeros((300, 250))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = matmul_arrays(a, b, out=out, comm=MPI.COMM_SELF, backend="cupy")
    assert len(_planned_again(caught)) == 1, [str(w.message) for w in caught]
    assert c is out and len(calls) >= 2
    host = cupy.asnumpy(c) if xp is cupy else c
    np.testing.assert_allclose(host, cupy.asnumpy(a @ b) if xp is cupy else a @ b, rtol=1e-12)
