"""Arrays of every kind given to ``summa.matmul`` (summa/api/arrayview.py,
summa/api/operands.py), and the planner's answer to operands that lie on a
GPU (summa.planning.plan.Placement).

Without a GPU, the kinds are small classes that speak the protocols torch,
JAX and CuPy arrays speak (``__array__``, DLPack, the CUDA array interface);
a fake ``torch`` or ``jax`` module stands for the library that wraps the
product. GPU operands themselves are tested in test_gpu.py."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
from mpi4py import MPI

import summa
from helpers import gemm_scaled_error, random_array, spy_out_of_core
from summa.api import arrayview, operands
from summa.api.arrayview import Operand
from summa.api.operands import Operands, describe
from summa.device.backend import resolve_dtype
from summa.planning.plan import Machine, Placement
from summa.planning.planner import make_plan
from summa.planning.request import PlanRequest

GiB = 1 << 30


# -- host arrays of other libraries ------------------------------------------------

class ArrayLike:
    """A host array NumPy reads through ``__array__`` (a view of `data`)."""

    def __init__(self, data):
        self.data = data

    def __array__(self, dtype=None, copy=None):
        return self.data


class DLPackHost:
    """A host array that speaks DLPack only (as some libraries' do)."""

    def __init__(self, data):
        self.data = data

    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()


class FakeTensor:
    """What a torch tensor looks like to summa: ``__array__``, DLPack, and a
    ``__cuda_array_interface__`` that raises AttributeError off the GPU."""

    __module__ = "torch"

    def __init__(self, data):
        self.data = data

    def __array__(self, dtype=None, copy=None):
        return self.data

    def __dlpack__(self, **kwargs):
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)

    @property
    def __cuda_array_interface__(self):
        raise AttributeError("Can't get __cuda_array_interface__ on non-CUDA tensor")

    # torch's lazy conjugation: conj() sets a bit on a view of the same memory
    def is_conj(self) -> bool:
        return False

    def conj(self):
        return LazyConj(self.data)

    @property
    def mT(self):
        return type(self)(self.data.T) if not self.is_conj() else LazyConj(self.data.T)


class LazyConj(FakeTensor):
    """A torch tensor with its conjugate bit set: the conjugate of `data`,
    which it holds unconjugated, and which NumPy and DLPack cannot read."""

    def is_conj(self) -> bool:
        return True

    def conj(self):
        return FakeTensor(self.data)

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("Can't call numpy() on Tensor that has conjugate bit set")

    def __dlpack__(self, **kwargs):
        raise BufferError("Can't export tensors with the conjugate bit set")


class FakeJaxArray(DLPackHost):
    __module__ = "jaxlib.xla_extension"

    def __array__(self, dtype=None, copy=None):
        return self.data


@pytest.fixture
def fake_torch(monkeypatch):
    """A ``torch`` module whose from_numpy wraps the product (a view)."""
    module = types.SimpleNamespace(from_numpy=FakeTensor, from_dlpack=None)
    monkeypatch.setitem(sys.modules, "torch", module)
    return module


@pytest.fixture
def fake_jax(monkeypatch):
    dlpack = types.ModuleType("jax.dlpack")
    dlpack.from_dlpack = lambda x: FakeJaxArray(np.from_dlpack(x))
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(dlpack=dlpack))
    monkeypatch.setitem(sys.modules, "jax.dlpack", dlpack)
    return dlpack


@pytest.mark.parametrize("wrap", [ArrayLike, DLPackHost, memoryview, lambda x: x.tolist()],
                         ids=["__array__", "dlpack", "memoryview", "list"])
def test_host_arrays_of_any_kind_multiply_and_come_back_as_numpy(rng, wrap):
    a, b = random_array(rng, (13, 9), "float64"), random_array(rng, (9, 7), "float64")
    c = summa.matmul(wrap(a), wrap(b), trans_b="N", alpha=0.5)
    assert type(c) is np.ndarray
    assert gemm_scaled_error(c, a, b, alpha=0.5) <= 1


@pytest.mark.parametrize("wrap", [ArrayLike, DLPackHost, memoryview, FakeTensor])
def test_host_arrays_are_read_in_place(rng, monkeypatch, wrap):
    seen = spy_out_of_core(monkeypatch)
    a, b = random_array(rng, (20, 12), "float32"), random_array(rng, (12, 8), "float32")
    c = summa.matmul(wrap(a), wrap(b), comm=MPI.COMM_SELF, out_of_core=True, panel_width=4)
    assert gemm_scaled_error(np.asarray(c), a, b) <= 1
    (A, B, _), = seen
    assert np.shares_memory(A, a) and np.shares_memory(B, b)


def test_a_torch_tensor_in_is_a_torch_tensor_out(rng, fake_torch):
    a, b = random_array(rng, (10, 6), "complex64"), random_array(rng, (10, 5), "complex64")
    c = summa.matmul(FakeTensor(a), FakeTensor(b), trans_a="H")
    assert isinstance(c, FakeTensor)
    assert gemm_scaled_error(c.data, a, b, trans_a="H") <= 1


def test_the_product_takes_the_kind_of_a(rng, fake_torch):
    a, b = random_array(rng, (4, 6), "float64"), random_array(rng, (6, 5), "float64")
    assert type(summa.matmul(a, FakeTensor(b))) is np.ndarray
    assert isinstance(summa.matmul(FakeTensor(a), b), FakeTensor)


def test_a_foreign_out_is_written_in_place_and_returned_as_passed(rng, fake_torch):
    a, b = random_array(rng, (8, 3), "float64"), random_array(rng, (3, 9), "float64")
    out = FakeTensor(np.full((8, 9), np.nan))
    assert summa.matmul(FakeTensor(a), b, out=out) is out
    assert gemm_scaled_error(out.data, a, b) <= 1


def test_a_jax_array_in_is_a_jax_array_out(rng, fake_jax):
    a, b = random_array(rng, (7, 7), "float64"), random_array(rng, (7, 7), "float64")
    c = summa.matmul(FakeJaxArray(a), FakeJaxArray(b), trans_b="T")
    assert isinstance(c, FakeJaxArray)
    assert gemm_scaled_error(c.data, a, b, trans_b="T") <= 1


def test_a_library_that_cannot_wrap_the_product_leaves_it_numpy_with_a_warning(
        rng, monkeypatch):
    def refuse(x):
        raise TypeError("no")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(from_numpy=refuse))
    a = random_array(rng, (5, 5), "float64")
    with pytest.warns(RuntimeWarning, match="torch could not take the product"):
        c = summa.matmul(FakeTensor(a), a)
    assert type(c) is np.ndarray and gemm_scaled_error(c, a, a) <= 1


def test_foreign_host_arrays_go_through_the_pool_and_come_back_as_their_kind(
        rng, fake_torch):
    a, b = random_array(rng, (40, 30), "float64"), random_array(rng, (30, 20), "float64")
    c = summa.matmul(FakeTensor(a), FakeTensor(b), workers=2, backend="numpy", panel_width=8)
    assert isinstance(c, FakeTensor) and gemm_scaled_error(c.data, a, b) <= 1


def test_the_stateful_matmul_takes_foreign_arrays(rng, fake_torch):
    a, b = random_array(rng, (12, 10), "float64"), random_array(rng, (10, 6), "float64")
    with summa.Matmul(FakeTensor(a), memoryview(b), comm=MPI.COMM_SELF) as m:
        assert m.plan.placement == Placement()
        assert isinstance(m.execute(), FakeTensor)
        a2 = random_array(rng, (12, 10), "float64")
        c = m.execute(ArrayLike(a2), b)
        assert type(c) is np.ndarray and gemm_scaled_error(c, a2, b) <= 1
        with pytest.raises(ValueError, match="not an array"):
            m.execute(object(), b)


# -- torch's lazy conjugates (t.conj(), t.mH): the conjugation becomes the op ----------

@pytest.mark.parametrize("trans_a", ["N", "T", "H"])
@pytest.mark.parametrize("mode", ["in memory", "out of core"])
def test_a_lazy_conjugate_is_read_where_it_lies_and_conjugated_by_the_op(
        rng, monkeypatch, fake_torch, trans_a, mode):
    x = random_array(rng, (9, 9), "complex128")  # square: every op of it is 9 x 9
    b = random_array(rng, (9, 6), "complex64").astype(np.complex128)
    seen = spy_out_of_core(monkeypatch)
    c = summa.matmul(FakeTensor(x).conj(), FakeTensor(b).conj(), trans_a=trans_a,
                     comm=MPI.COMM_SELF, out_of_core=mode == "out of core", panel_width=4)
    assert isinstance(c, FakeTensor)
    assert gemm_scaled_error(c.data, np.conj(x), np.conj(b), trans_a=trans_a) <= 1
    if seen:  # read as they lie: no conjugated copy
        (A, B, _), = seen
        assert np.shares_memory(A, x) and np.shares_memory(B, b)


def test_a_hermitian_transpose_view_multiplies_as_torch_would(rng, fake_torch):
    """``t.mH @ t`` (a Gram matrix of complex data), written as torch users do."""
    x = random_array(rng, (11, 7), "complex64")
    c = summa.matmul(FakeTensor(x).conj().mT, FakeTensor(x))
    assert gemm_scaled_error(c.data, x, x, trans_a="H") <= 1


def test_lazy_conjugates_go_through_the_pool(rng, fake_torch):
    a, b = random_array(rng, (30, 20), "complex128"), random_array(rng, (20, 10), "complex128")
    c = summa.matmul(FakeTensor(a).conj(), FakeTensor(b), workers=2, backend="numpy",
                     panel_width=8)
    assert gemm_scaled_error(c.data, np.conj(a), b) <= 1


@pytest.mark.mpi(min_size=2)
def test_a_lazy_conjugate_on_the_root_sets_the_ops_of_every_rank(comm, rng, fake_torch):
    root = comm.Get_size() - 1
    a, b = random_array(rng, (12, 10), "complex128"), random_array(rng, (12, 5), "complex128")
    mine = comm.rank == root
    c = summa.matmul(FakeTensor(a).conj() if mine else None, FakeTensor(b) if mine else None,
                     trans_a="T", comm=comm, root=root, backend="numpy")
    if mine:
        assert gemm_scaled_error(c.data, np.conj(a), b, trans_a="T") <= 1
    else:
        assert c is None


def test_the_stateful_matmul_keeps_a_lazy_conjugates_ops(rng, fake_torch):
    a, b = random_array(rng, (8, 8), "complex128"), random_array(rng, (8, 3), "complex128")
    with summa.Matmul(FakeTensor(a).conj(), FakeTensor(b), comm=MPI.COMM_SELF) as m:
        assert gemm_scaled_error(m.execute().data, np.conj(a), b) <= 1
        a2 = random_array(rng, (8, 8), "complex128")
        assert gemm_scaled_error(m.execute(FakeTensor(a2).conj(), b).data, np.conj(a2),
                                 b) <= 1
        with pytest.raises(ValueError, match="lazily conjugated operand"):
            m.execute(FakeTensor(a2), b)


def test_torch_lazy_conjugates_multiply_as_torch_does(rng):
    """The same with torch itself, where it is installed."""
    torch = pytest.importorskip("torch")
    x = random_array(rng, (14, 9), "complex64")
    t = torch.from_numpy(x)
    for trans in ("N", "T", "H"):
        c = summa.matmul(t.conj(), t.conj().mT if trans == "N" else t, trans_a=trans)
        want = np.conj(x) if trans == "N" else x.T if trans == "H" else x.conj().T
        assert isinstance(c, torch.Tensor)
        assert gemm_scaled_error(c.numpy(), want, np.conj(x).T if trans == "N" else x) <= 1


@pytest.mark.parametrize("where", ["cpu", "default"])
def test_jax_arrays_multiply_and_come_back_as_jax_arrays(rng, where):
    """With JAX itself, where it is installed: its arrays (immutable), on
    the CPU and on JAX's default device (a GPU where it has one), are read
    in place and the product comes back as one there; as `out` refused
    (on a GPU CuPy would have written into it)."""
    jax = pytest.importorskip("jax")
    device = jax.devices("cpu")[0] if where == "cpu" else jax.devices()[0]
    x = random_array(rng, (12, 9), "float32")
    j = jax.device_put(x, device)
    c = summa.matmul(j.T, j)
    assert isinstance(c, jax.Array) and c.devices() == {device}
    assert gemm_scaled_error(np.asarray(c), x, x, trans_a="T") <= 1
    out = jax.device_put(np.zeros((12, 12), "float32"), device)
    with pytest.raises(ValueError, match="out is read-only"):
        summa.matmul(j, j.T, out=out)
    assert not np.asarray(out).any()


def test_a_lazily_conjugated_out_is_refused(rng, fake_torch):
    a = random_array(rng, (4, 4), "complex128")
    with pytest.raises(ValueError, match="out has its conjugate bit set"):
        summa.matmul(a, a, out=FakeTensor(np.empty((4, 4), complex)).conj())


# -- refusals: one ValueError naming the argument and why -----------------------------

class CudaInterface:
    """An array that declares GPU memory by the CUDA array interface (Numba's)."""

    __cuda_array_interface__ = {"shape": (4, 4), "typestr": "<f8", "data": (1 << 40, False),
                                "version": 3, "strides": None}
    shape, dtype = (4, 4), np.dtype("float64")


class DLPackDevice:
    """An array whose DLPack device is `kind` (2: CUDA, 10: ROCm)."""

    def __init__(self, kind=2, fails=False):
        self.kind, self.fails = kind, fails

    def __dlpack__(self, **kwargs):
        raise BufferError("not here")

    def __dlpack_device__(self):
        if self.fails:
            raise RuntimeError("lost its device")
        return (self.kind, 0)


class NeedsGrad(FakeTensor):
    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("Can't call numpy() on Tensor that requires grad")


class BFloat16(FakeTensor):
    """A dtype NumPy has no type for: torch's bfloat16."""

    dtype = "torch.bfloat16"

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Got unsupported ScalarType BFloat16")


class Copied(ArrayLike):
    """``__array__`` gives a fresh copy: no use as `out`."""

    def __array__(self, dtype=None, copy=None):
        return self.data.copy()


@pytest.mark.parametrize("make,match", [
    (lambda: CudaInterface(), "lies on a GPU, but CuPy is not installed"),
    (lambda: DLPackDevice(2), "lies on a GPU, but CuPy is not installed"),
    (lambda: DLPackDevice(10), "ROCm device, which summa cannot use"),
    (lambda: DLPackDevice(99), "DLPack device type 99"),
    (lambda: DLPackDevice(fails=True), "does not say where its data lie"),
    (lambda: NeedsGrad(np.ones((4, 4))), "requires grad"),
    (lambda: BFloat16(np.ones((4, 4))), "dtype torch.bfloat16, which summa does not multiply: "
                                        "choose one of float64"),
    (lambda: object(), "a is not an array"),
    (lambda: "4x4", "a is not an array"),
    (lambda: FakeTensor(np.ones((4, 4), dtype=np.longdouble)), "unsupported dtype"),
    (lambda: FakeTensor(np.ones((4, 4, 1))), "inner dimensions differ"),  # a stack of 4 x 1
])
def test_unusable_arrays_are_refused_with_one_clear_error(monkeypatch, make, match):
    monkeypatch.setattr(arrayview, "cupy_module", lambda: None)  # as on a machine without CuPy
    x = make()
    with pytest.raises(ValueError, match=match):
        summa.matmul(x, x, backend="numpy")


def test_a_dtype_numpy_knows_only_through_ml_dtypes_is_refused_by_name():
    """ml_dtypes (JAX's) gives NumPy a bfloat16 of its own: a bfloat16
    tensor is still refused naming its dtype, not in its library's words."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert np.dtype("bfloat16") == ml_dtypes.bfloat16
    with pytest.raises(ValueError, match="dtype torch.bfloat16, which summa does not multiply"):
        summa.matmul(BFloat16(np.ones((4, 4))), np.ones((4, 4)), backend="numpy")


def test_an_out_that_is_a_copy_is_refused():
    a = np.ones((3, 3))
    with pytest.raises(ValueError, match="out must be a NumPy array, a GPU array, or an array"):
        summa.matmul(a, a, out=Copied(np.empty((3, 3))))
    with pytest.raises(ValueError, match="NumPy array"):
        summa.matmul(a, a, out=[[0.0] * 3] * 3)


@pytest.mark.mpi(min_size=1)
def test_a_gpu_array_without_cupy_is_refused_on_every_rank(comm, monkeypatch):
    monkeypatch.setattr(arrayview, "cupy_module", lambda: None)
    root = comm.Get_size() - 1
    mine = comm.rank == root
    with pytest.raises(ValueError, match="CuPy is not installed"):
        summa.matmul(CudaInterface() if mine else None, np.ones((4, 4)) if mine else None,
                     root=root, backend="numpy")


# -- operands on GPUs, described (a stand-in CuPy: the checks, not the data) ---------

class GpuArray:
    """A stand-in CuPy array: NumPy data on "GPU" `index`."""

    def __init__(self, data, index=0):
        self.data, self.device = data, types.SimpleNamespace(id=index)
        self.shape, self.dtype, self.ndim = data.shape, data.dtype, data.ndim
        self.strides, self.size, self.itemsize = data.strides, data.size, data.itemsize
        self.flags = data.flags

    def __dlpack_device__(self):
        return (2, self.device.id)

    def set(self, host):
        self.data[...] = host

    def __setitem__(self, key, value):
        self.data[key] = value.data if isinstance(value, GpuArray) else value


class StandInCupy(types.ModuleType):
    """What summa.api.operands asks of CuPy: the current device, its free
    memory, copies in and out (each noting the device current then)."""

    def __init__(self, free=1 << 30):
        super().__init__("cupy")
        import importlib.machinery
        self.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
        self.ndarray, self.current, self.free, self.copies = GpuArray, [0], free, []
        runtime = types.SimpleNamespace(getDevice=lambda: self.current[0],
                                        setDevice=lambda d: self.current.__setitem__(0, d),
                                        memGetInfo=lambda: (self.free, 1 << 40))
        self.cuda = types.SimpleNamespace(Device=self._device, runtime=runtime,
                                          memory=types.SimpleNamespace(
                                              OutOfMemoryError=MemoryError))

    def _device(self, index):
        module = self

        class Device:
            def __enter__(self):
                self.before = module.current[0]
                module.current[0] = index

            def __exit__(self, *exc):
                module.current[0] = self.before
        return Device()

    def get_default_memory_pool(self):
        return types.SimpleNamespace(free_bytes=lambda: 0)

    def asarray(self, host):
        self.copies.append(("up", self.current[0]))
        return GpuArray(np.array(host), self.current[0])

    def asnumpy(self, x):
        self.copies.append(("down", self.current[0]))
        return x.data.copy()

    def may_share_memory(self, x, y):
        return np.may_share_memory(x.data, y.data)


@pytest.fixture
def stand_in_cupy(monkeypatch):
    module = StandInCupy()
    monkeypatch.setattr(arrayview, "cupy_module", lambda: module)
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def test_operands_on_two_gpus_are_refused(stand_in_cupy):
    x = np.ones((4, 4))
    with pytest.raises(ValueError, match="a is on GPU 0 and b on GPU 1"):
        describe(GpuArray(x, 0), GpuArray(x, 1))


@pytest.mark.parametrize("a_gpu,b_gpu,out_gpu,match", [
    (0, 0, None, "out is in host memory, but .* comes back on GPU 0"),
    (0, None, None, "out is in host memory, but .* comes back on GPU 0"),
    (None, None, 0, "out is on GPU 0, but .* comes back in host memory"),
    (1, 1, 0, "out is on GPU 0, but .* comes back on GPU 1"),
])
def test_an_out_elsewhere_than_the_product_comes_back_is_refused(stand_in_cupy, a_gpu, b_gpu,
                                                                 out_gpu, match):
    def on(x, gpu):
        return x if gpu is None else GpuArray(x, gpu)
    x = np.ones((4, 4))
    with pytest.raises(ValueError, match=match):
        describe(on(x, a_gpu), on(x, b_gpu), on(np.empty((4, 4)), out_gpu))


def test_the_placement_counts_what_lies_on_the_gpu_and_what_the_gemm_copies(stand_in_cupy):
    a, b = np.ones((64, 32)), np.ones((32, 16))
    assert describe(a, b).placement == Placement()
    both = describe(GpuArray(a, 1), GpuArray(b, 1)).placement
    assert both == Placement("device", 1, held=a.nbytes + b.nbytes)
    mixed = describe(a, GpuArray(b, 1), GpuArray(np.empty((64, 16)), 1))
    assert mixed.placement == Placement("mixed", 1, held=b.nbytes, copies=a.nbytes,
                                        into_out=True)
    assert mixed.home is mixed.b  # the product takes the GPU operand's kind
    wide = np.ones((64, 64))
    strided = describe(GpuArray(wide[::2, ::2], 0), GpuArray(wide.T, 0)).placement
    assert strided.copies == wide[::2, ::2].nbytes  # cuBLAS reads the transposed one as it lies


def test_host_operands_are_their_own_host_copies():
    a, b = np.ones((3, 2)), np.ones((2, 4))
    host = describe(a, ArrayLike(b)).host_arrays()
    assert host[0] is a and np.shares_memory(host[1], b) and host[2] is None


def test_the_caller_passing_numpy_gets_the_very_arrays_described():
    a = np.ones((3, 3))
    given = describe(a, a, np.empty((3, 3)))
    assert isinstance(given, Operands) and isinstance(given.a, Operand)
    assert (given.a.source, given.a.array, given.a.device, given.a.library) == (a, a, None,
                                                                                "numpy")
    assert given.out.array is given.out.source


# -- the planner: operands on a GPU are one GEMM there, or go through host memory ------

def _plan(placement, free=80 * GiB, ranks=1, backend="cupy", shape=(16384, 16384, 16384),
          dtype="float64", host_held=False, **options):
    return make_plan(shape, dtype, Machine(backend, ranks, free_device=free),
                     PlanRequest(**options), host_held=host_held, placement=placement)


def _held(m, n, k, item=8):
    return (m * k + k * n) * item


def test_operands_on_the_gpu_plan_one_gemm_there_needing_only_the_product():
    placement = Placement("device", 1, held=_held(16384, 16384, 16384))
    plan = _plan(placement)
    assert plan.placement.resident and plan.grid == (1, 1) and not plan.out_of_core
    assert plan.memory.mode == "on-device" and plan.memory.device_bytes == 16384**2 * 8
    assert plan.memory.host_bytes == 0 and plan.note is None
    assert "GPU 1, multiplied there in one GEMM" in str(plan)
    assert json.loads(json.dumps(plan.as_dict()))["placement"]["device"] == 1
    into_out = _plan(Placement("device", 1, into_out=True))
    assert into_out.memory.device_bytes == 0


@pytest.mark.parametrize("change,why", [
    (dict(free=1 * GiB), "the product needs 2.00 GiB there, 1.00 GiB free"),
    (dict(ranks=2, grid=(2, 1)), "runs on 2 ranks"),
    (dict(backend="numpy"), "numpy backend multiplies in host memory"),
    (dict(out_of_core=True), "out_of_core=True"),
    (dict(device_memory="5GiB"), "they and the product need 6.00 GiB, more than device_memory"),
])
def test_operands_go_through_host_memory_where_one_gemm_cannot_run_there(change, why):
    plan = _plan(Placement("device", 0, held=_held(16384, 16384, 16384)), **change)
    assert plan.placement.fetched and not plan.placement.resident
    assert "operands on GPU 0 are copied to host memory" in plan.note and why in plan.note
    assert "copied to host memory first" in str(plan)


def test_a_device_memory_cap_that_holds_everything_keeps_the_gemm_there():
    plan = _plan(Placement("device", 0, held=_held(16384, 16384, 16384)),
                 device_memory="6GiB")
    assert plan.placement.resident


def test_what_the_gemm_needs_beside_the_operands_is_counted():
    m = n = k = 4096
    base = _plan(Placement("device", 0), shape=(m, n, k)).memory.device_bytes
    mixed = _plan(Placement("mixed", 0, copies=m * k * 8), shape=(m, n, k)).memory.device_bytes
    assert mixed == base + m * k * 8
    conj = _plan(Placement("device", 0), shape=(m, n, k), dtype="complex128", trans_a="H",
                 trans_b="T").memory.device_bytes
    assert conj == 2 * base + m * k * 16  # C, and A's conjugate (B is read transposed)
    emulated = _plan(Placement("device", 0), shape=(m, n, k), precision="fp64-int8")
    assert emulated.memory.device_bytes > 3 * base and emulated.moduli is not None


def test_host_operands_plan_as_before():
    host = _plan(None, shape=(4096, 4096, 4096), host_held=True)
    assert host.placement == Placement() and host == _plan(Placement(), shape=(
        4096, 4096, 4096), host_held=True)
    assert "GPU" not in str(host)


def test_gpu_operands_are_fetched_from_their_gpu_and_the_product_goes_back_there(
        stand_in_cupy):
    a, b = np.ones((4, 3)), np.ones((3, 2))
    given = describe(GpuArray(a, 1), b)
    host_a, host_b, out = given.host_arrays()
    assert np.array_equal(host_a, a) and host_b is b and out is None
    assert stand_in_cupy.copies == [("down", 1)] and stand_in_cupy.current == [0]
    c = given.give_back(host_a @ host_b)
    assert isinstance(c, GpuArray) and c.device.id == 1 and np.array_equal(c.data, a @ b)
    assert stand_in_cupy.copies[-1] == ("up", 1) and stand_in_cupy.current == [0]


def test_a_product_that_does_not_fit_its_gpu_stays_in_host_memory_with_a_warning(
        stand_in_cupy):
    stand_in_cupy.free = 100
    given = describe(GpuArray(np.ones((4, 4)), 0), GpuArray(np.ones((4, 4)), 0))
    with pytest.warns(RuntimeWarning, match="does not fit in the free memory of GPU 0") as seen:
        c = given.give_back(np.ones((4, 4)))
    assert type(c) is np.ndarray
    assert seen[0].filename == __file__  # the warning points at the caller's line


def test_a_product_made_in_host_memory_fills_a_gpu_out(stand_in_cupy):
    out = GpuArray(np.zeros((2, 2)), 0)
    given = describe(GpuArray(np.ones((2, 3)), 0), GpuArray(np.ones((3, 2)), 0), out)
    assert given.host_arrays()[2] is None  # the host plan makes its own
    assert given.give_back(np.full((2, 2), 3.0)) is out and np.all(out.data == 3)


@pytest.mark.parametrize("make", [lambda a: a, lambda a: GpuArray(np.zeros((4, 4), order="F")),
                                  lambda a: GpuArray(np.zeros((4, 8))[:, ::2]),
                                  lambda a: GpuArray(a.data[::-1])], ids=[
    "out is a", "Fortran", "strided", "a's memory reversed"])
def test_a_gpu_out_that_cannot_be_written_where_it_lies_is_filled(stand_in_cupy, make):
    """A GPU `out` sharing memory with an operand or whose rows are not
    contiguous is not written in place: the plan counts a product of its
    own on the GPU (Placement.into_out False), and give_back fills `out`."""
    a, b = GpuArray(np.ones((4, 4))), GpuArray(np.ones((4, 4)))
    out = make(a)
    given = describe(a, b, out)
    assert not given.out_in_place and not given.placement.into_out
    assert given.give_back(np.full((4, 4), 3.0)) is out and np.all(out.data == 3)
    assert describe(a, b, GpuArray(np.zeros((4, 4)))).out_in_place


def test_the_callers_current_gpu_is_kept(stand_in_cupy):
    stand_in_cupy.current[0] = 1
    with operands.kept_device():
        stand_in_cupy.current[0] = 0  # as a backend binding GPU 0 does
    assert stand_in_cupy.current == [1]


def test_a_resident_fp64_int8_gemm_takes_the_plans_rows(monkeypatch):
    """Operands on the GPU whose fp64-int8 product fits there only in chunks
    of rows: the plan's rows (Plan.scheme) reach the one GEMM where they lie
    (summa.execution.arrays.run_on_device; a stand-in backend notes its call;
    the moduli: its K's default, none asked)."""
    import contextlib
    from summa.execution.arrays import run_on_device
    from summa.planning.arrays import HeldArrays
    from summa.planning import tiling
    from summa.precision import ozaki_gpu
    monkeypatch.setattr(tiling, "FP64_INT8_ROWS", 8)
    n = 64
    free = 8 * n * n + ozaki_gpu.scratch_bytes(n, n, n, ozaki_gpu.moduli_for(n), rows=16)
    plan = _plan(Placement("device", 0, held=_held(n, n, n)), free=free, shape=(n, n, n),
                 precision="fp64-int8")
    assert plan.placement.resident and plan.memory.int8_rows == 16
    calls = []
    be = types.SimpleNamespace(
        is_gpu=True, has_int8_tensor_cores=lambda: True, name="cupy",
        xp=types.SimpleNamespace(cuda=types.SimpleNamespace(
            Device=lambda index: contextlib.nullcontext()), empty=np.empty),
        asarray=lambda x: x, gemm=lambda *args, **kwargs: calls.append(kwargs))
    a = np.ones((n, n))
    run_on_device(plan, be, HeldArrays(a, a))
    assert [(c["precision"], c["scheme"]) for c in calls] == [
        ("fp64-int8", ozaki_gpu.Scheme(rows=16))]


@pytest.mark.parametrize("layout", ["C", "F", "T view"])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("how", ["in memory", "out of core"])
def test_operands_in_non_native_byte_order_multiply_in_their_type(rng, layout, dtype, how):
    """Operands stored big-endian (another machine's file, a FITS array) are
    read into native order (NumPy's matmul converts them too) and multiply
    in their type, by a Matmul too; the product is native; theirs unchanged."""
    from test_layouts import operand
    x, y = (operand(rng, shape, dtype, layout)[0] for shape in ((37, 21), (21, 29)))
    swapped = [v.astype(v.dtype.newbyteorder(">" if v.dtype.isnative else "<")) for v in (x, y)]
    kept = [v.copy() for v in swapped]
    assert not any(v.dtype.isnative for v in swapped)
    kwargs = dict(comm=MPI.COMM_SELF, backend="numpy")
    kwargs.update({"device_memory": "4KiB"} if how == "out of core" else {})
    c = summa.matmul(*swapped, **kwargs)
    assert c.dtype == np.dtype(dtype) and c.dtype.isnative
    assert gemm_scaled_error(c, x, y) <= 1
    with summa.Matmul(x, y, **kwargs) as m:
        assert gemm_scaled_error(m.execute(*swapped), x, y) <= 1
    assert all(np.array_equal(v, w) and v.dtype == w.dtype for v, w in zip(swapped, kept))


def test_an_out_in_non_native_byte_order_is_refused_by_name(rng):
    a, b = random_array(rng, (7, 5), "float64"), random_array(rng, (5, 3), "float64")
    out = np.zeros((7, 3), dtype=np.dtype("float64").newbyteorder("S"))
    with pytest.raises(ValueError, match=r"out is float64 in non-native byte order .*pass out "
                                         r"of dtype"):
        summa.matmul(a, b, out=out, comm=MPI.COMM_SELF, backend="numpy")
    assert not out.any()
    swapped = np.dtype("complex64").newbyteorder("S")
    with pytest.raises(ValueError, match=r"complex64 in non-native byte order; summa multiplies "
                                         r"native complex64"):
        resolve_dtype(swapped)
