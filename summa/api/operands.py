"""The arrays a caller hands to ``summa.matmul``, wherever they lie, and the
product handed back as the caller's kind of array.

:func:`describe` normalises the operands once, where the call enters: each
becomes an :class:`Operand`, a NumPy array over the caller's host memory or
a CuPy array over the caller's GPU memory (no copy either way where the
library lets us view it), with the GPU it lies on and the library whose
array it was. Their joint :attr:`Operands.placement` is what the planner
weighs (:class:`summa.planning.plan.Placement`); :meth:`Operands.give_back` turns
the product into the caller's kind.

What is taken:

* NumPy arrays, as they are.
* CuPy arrays, and any object on a CUDA GPU that exports DLPack
  (``__dlpack__`` with ``__dlpack_device__``: torch CUDA tensors, JAX arrays)
  or the CUDA array interface (``__cuda_array_interface__``: Numba), viewed
  through CuPy in place. CuPy is imported only here, and only for them.
* Host arrays of other libraries: anything NumPy views without a copy
  (``__array__``, the buffer protocol, ``__array_interface__``: torch CPU
  tensors, memoryviews), or DLPack producers on the CPU (``np.from_dlpack``);
  lists of numbers too (copied, as NumPy does).

The product comes back as CuPy or NumPy, or as the library's own array where
the library can wrap it without a copy: torch (``torch.from_dlpack``,
``torch.from_numpy``) and JAX (``jax.dlpack.from_dlpack``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import warnings
from dataclasses import dataclass, replace

import numpy as np

from ..planning.checks import not_in_place
from ..device.backend import DTYPES
from ..host.copies import converted, parallel_copy
from ..planning.plan import Placement
from .promotion import as_float64

__all__ = ["Operand", "Operands", "operand", "describe", "unconjugated", "cupy_module",
           "kept_device", "as_kind", "library_of", "lies_on_gpu", "lazy_conjugate", "exactly",
           "DLPACK_CPU", "DLPACK_CUDA"]

#: DLPack's device types (dlpack.h, ``DLDeviceType``) summa reads: host
#: memory (plain, and CUDA's page-locked), and CUDA GPU memory (plain, managed).
DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13
_HOST_TYPES = (DLPACK_CPU, DLPACK_CUDA_HOST)
_CUDA_TYPES = (DLPACK_CUDA, DLPACK_CUDA_MANAGED)
#: The others, by name, for the message that refuses them.
_OTHER_DEVICES = {4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host",
                  12: "ext_dev", 14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}
#: Packages whose arrays the product is given back as (their root package's
#: name as the array's type says it; jaxlib's arrays are JAX's).
_ALIASES = {"jaxlib": "jax"}


def cupy_module():
    """The ``cupy`` module, imported now, or None where it is not installed."""
    if importlib.util.find_spec("cupy") is None:
        return None
    import cupy
    return cupy


@dataclass(frozen=True)
class Operand:
    """One array as the caller passed it and as summa reads it.

    Attributes
    ----------
    source : object
        What the caller passed (returned as it is where it is `out`).
    array : numpy.ndarray or cupy.ndarray
        Its data: the same memory where the library lets NumPy or CuPy view
        it (lists of numbers are copied).
    device : int or None
        The CUDA device it lies on; None: host memory.
    library : str
        The package of its type (``"numpy"``, ``"cupy"``, ``"torch"``,
        ``"jax"`` ...), whose array the product is given back as where it can.
    """

    source: object
    array: object
    device: int | None
    library: str

    @property
    def nbytes(self) -> int:
        return int(self.array.size) * self.array.itemsize

    @property
    def kind(self) -> str:
        """Its type, as messages name it (``torch.Tensor``)."""
        return f"{type(self.source).__module__}.{type(self.source).__name__}"

    def to_host(self, backend=None) -> np.ndarray:
        """Its data in host memory: `array` itself on the host, else a copy
        (through `backend`'s page-locked staging where `backend` runs on
        its GPU, :meth:`summa.device.backend.CupyBackend.to_host`)."""
        if self.device is None:
            return self.array
        if backend is not None and backend.is_gpu and backend.device == self.device:
            return backend.to_host(self.array)
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(self.device):
            return cupy.asnumpy(self.array)


#: An op of a lazy conjugate conj(X) as an op of X itself, as
#: ``(transpose X first, op)``: conj(X) is (X^T)^H, conj(X)^T is X^H and
#: conj(X)^H is X^T.
_UNCONJUGATED = {"N": (True, "H"), "T": (False, "H"), "H": (False, "T")}


def unconjugated(x, trans: str) -> tuple:
    """``(x', trans')`` with ``op'(x') = op(x)``, `x'` the data as they lie,
    where `x` is a lazy conjugate: a torch tensor with its conjugate bit set
    (``t.conj()``, ``t.mH``, ``t.adjoint()``), which NumPy, CuPy and DLPack
    do not read. The conjugation becomes the GEMM's op, as a Fortran order
    or a transposed view does: no copy. Anything else: ``(x, trans)``.

    Parameters
    ----------
    x : array or None
    trans : {"N", "T", "H"}
        The op asked of `x` (any other is left for the checks to refuse).
    """
    if trans not in _UNCONJUGATED or getattr(x, "ndim", 2) != 2 or not lazy_conjugate(x):
        return x, trans
    try:
        plain = x.conj()  # the same memory, the bit cleared
    except Exception:  # noqa: BLE001 -- not torch's: the checks say what it is
        return x, trans
    transpose, code = _UNCONJUGATED[trans]
    return (plain.mT if transpose else plain), code


def lazy_conjugate(x) -> bool:
    """Is `x` a lazy conjugate (``x.is_conj()``: torch's conjugate bit)?"""
    is_conj = getattr(x, "is_conj", None)
    try:
        return callable(is_conj) and bool(is_conj())
    except Exception:  # noqa: BLE001 -- another library's is_conj: not torch's bit
        return False


def library_of(x) -> str:
    root = type(x).__module__.partition(".")[0]
    return _ALIASES.get(root, root)


def _kind(x) -> str:
    return f"{type(x).__module__}.{type(x).__name__}"


def operand(x, name: str) -> Operand:
    """`x` (the argument called `name`) as an :class:`Operand`.

    Raises
    ------
    ValueError
        One sentence naming `name` and why: not an array; on a GPU while
        CuPy is not installed; on a device that is not a CUDA GPU; data
        its library would not let NumPy or CuPy read; a lazy conjugate
        (operands' are read by :func:`unconjugated` first: an `out` one);
        an `out` in non-native byte order (operands so stored are copied
        into native order, :func:`_native`).
    """
    if x is None:
        raise ValueError(f"the root rank must pass the array {name}")
    if isinstance(x, np.ndarray):
        return Operand(x, _native(x, name), None, "numpy")
    if lazy_conjugate(x):  # (operands' bits were moved into their ops: out's cannot be)
        raise ValueError(f"{name} has its conjugate bit set (torch's lazy conj()): summa "
                         "cannot write into it in place; pass a tensor without it")
    place = _dlpack_device(x, name)
    if place is not None and place[0] not in _HOST_TYPES:
        if place[0] not in _CUDA_TYPES:
            where = _OTHER_DEVICES.get(place[0], f"DLPack device type {place[0]}")
            raise ValueError(f"{name} ({_kind(x)}) lies on a {where} device, which summa "
                             "cannot use: pass it in host memory or on a CUDA GPU")
        return _on_gpu(x, name)
    if place is None and _has_cuda_interface(x):
        return _on_gpu(x, name)
    return Operand(x, _native(_host_array(x, name, place is not None), name), None,
                   library_of(x))


def _native(x: np.ndarray, name: str) -> np.ndarray:
    """`x` in native byte order: an operand stored the other way (a big-endian
    file's array) copied once, as NumPy's own matmul converts it; refused as
    `out`, which the product is written into in place."""
    if x.dtype.isnative:
        return x
    native = x.dtype.newbyteorder("=")
    if name == "out":
        raise ValueError(f"out is {native.name} in non-native byte order ({x.dtype.str}): "
                         f"summa writes the product in native byte order; pass out of dtype "
                         f"'{native.str}'")
    return converted(x, native)


def _dlpack_device(x, name: str):
    """``(DLPack device type, index)`` of `x`, None where it has no
    ``__dlpack_device__``."""
    ask = getattr(x, "__dlpack_device__", None)
    if ask is None:
        return None
    try:
        kind, index = ask()
        return int(kind), int(index)
    except Exception as exc:  # noqa: BLE001 -- any library's own error, said once
        raise ValueError(f"{name} ({_kind(x)}) does not say where its data lie "
                         f"(__dlpack_device__: {type(exc).__name__}: {exc})") from None


def lies_on_gpu(x, name: str = "the operand") -> bool:
    """Does `x` (any array-like the caller passes) lie on a CUDA GPU, by
    DLPack's word or the CUDA array interface?"""
    place = _dlpack_device(x, name)
    return place[0] in _CUDA_TYPES if place is not None else _has_cuda_interface(x)


def _has_cuda_interface(x) -> bool:
    """Does `x` export GPU memory by the CUDA array interface? (torch has the
    attribute on CPU tensors too, raising AttributeError there: asked of the
    object, not its type.)"""
    try:
        return hasattr(x, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 -- a GPU array that cannot export: CuPy says why
        return True


def _on_gpu(x, name: str) -> Operand:
    """`x`, on a CUDA GPU, viewed as a CuPy array (DLPack where it has it,
    else the CUDA array interface): no copy."""
    cupy = cupy_module()
    if cupy is None:
        raise ValueError(f"{name} ({_kind(x)}) lies on a GPU, but CuPy is not installed here: "
                         "summa reads GPU arrays through CuPy. Install CuPy, or pass the "
                         "operands in host memory")
    try:
        if isinstance(x, cupy.ndarray):
            array = x
        elif hasattr(x, "__dlpack__"):
            array = cupy.from_dlpack(x)
        else:
            array = cupy.asarray(x)
        device = int(array.device.id)
    except Exception as exc:  # noqa: BLE001 -- the library's or CUDA's own error, said once
        raise ValueError(_foreign_dtype(x, name) or
                         f"{name} ({_kind(x)}) lies on a GPU this process cannot read through "
                         f"CuPy ({type(exc).__name__}: {exc})") from None
    return Operand(x, array, device, library_of(x))


def _array_like(x) -> bool:
    """Does NumPy view `x` by a protocol of its own (not DLPack)?"""
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__") or \
            isinstance(x, (list, tuple)):
        return True
    try:
        memoryview(x)
        return True
    except TypeError:
        return False


def _host_array(x, name: str, dlpack: bool) -> np.ndarray:
    """`x` in host memory as a NumPy array: a view where its library gives
    one (``__array__``, the buffer protocol; DLPack where it has no other)."""
    if isinstance(x, (str, bytes)) or not (dlpack or _array_like(x)):
        raise ValueError(f"{name} is not an array ({_kind(x)})")
    try:
        array = np.from_dlpack(x) if dlpack and not _array_like(x) else np.asarray(x)
    except Exception as exc:  # noqa: BLE001 -- any library's refusal, said once
        raise ValueError(_foreign_dtype(x, name) or
                         f"{name} is not an array NumPy can read ({_kind(x)}: "
                         f"{type(exc).__name__}: {exc})") from None
    if array.dtype.hasobject:
        raise ValueError(f"{name} is not an array of numbers ({_kind(x)})")
    return array


def _foreign_dtype(x, name: str) -> str | None:
    """Why `x` is refused where its library's dtype is one NumPy has no type
    for (torch's bfloat16 and float8 types): the dtype and the choices;
    None where its dtype is not why NumPy or CuPy would not read it."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return None
    try:
        known = np.dtype(str(dtype).rpartition(".")[2])  # torch.float32 -> float32
    except TypeError:
        known = None
    # ml_dtypes (JAX's) gives NumPy bfloat16 and the float8 types, as kind "V"
    if known is not None and known.kind != "V":
        return None
    return (f"{name} has dtype {dtype}, which summa does not multiply: choose one of "
            f"{', '.join(DTYPES)} (float16 on GPUs only) and convert it first")


@dataclass(frozen=True)
class Operands:
    """The operands of one product (and `out`, where given), described
    (:func:`describe`).

    Attributes
    ----------
    a, b : Operand
    out : Operand or None
    out_in_place : bool
        Whether the product is written into `out` where it lies: not where
        its rows are not contiguous (Fortran order, a ``.T`` or strided
        view) or it shares memory with `a` or `b` (C's blocks would
        overwrite panels still to be read). Such an `out` in host memory is
        filled from a product of its own at the end (:meth:`give_back`), as
        NumPy's matmul fills an overlapping one; on a GPU too, by a copy
        there.
    result_dtype : numpy.dtype or None
        The type the product is given back in where it is not the one it
        is computed in: integer operands, multiplied exactly in float64
        (:func:`summa.api.promotion.exact_integers`).
    kept_integers : bool
        `a` and `b` are integer host arrays still (:meth:`host_arrays`).
    """

    a: Operand
    b: Operand
    out: Operand | None = None
    out_in_place: bool = True
    result_dtype: np.dtype | None = None
    kept_integers: bool = False

    @property
    def arrays(self) -> tuple:
        """``(a, b, out)`` as NumPy or CuPy arrays (out None where not given)."""
        return self.a.array, self.b.array, None if self.out is None else self.out.array

    @property
    def home(self) -> Operand:
        """The operand whose kind the product takes: `a`, or where only `b`
        lies on a GPU, `b`."""
        return self.b if self.a.device is None and self.b.device is not None else self.a

    @property
    def placement(self) -> Placement:
        """Where they lie, as the planner weighs it."""
        on_gpu = [x for x in (self.a, self.b) if x.device is not None]
        if not on_gpu:
            return Placement()
        in_host = [x for x in (self.a, self.b) if x.device is None]
        relaid = [x for x in on_gpu if not _gemm_reads(x.array)]
        return Placement("mixed" if in_host else "device", on_gpu[0].device,
                         held=sum(x.nbytes for x in on_gpu),
                         copies=sum(x.nbytes for x in in_host + relaid),
                         into_out=self.out is not None and self.out_in_place)

    def host_arrays(self, backend=None, as_they_lie: bool = False) -> tuple:
        """``(a, b, out)`` in host memory for the host plan: operands on a GPU
        copied (:meth:`Operand.to_host`), `out` only where it lies in host
        memory and is written in place (None where it is on a GPU or
        :attr:`out_in_place` is False: :meth:`give_back` fills it);
        :attr:`kept_integers` into float64 whole unless `as_they_lie`."""
        out = self.out.array if self.out is not None and self.out.device is None \
            and self.out_in_place else None
        x = self if as_they_lie or not self.kept_integers else as_float64(self)
        return x.a.to_host(backend), x.b.to_host(backend), out

    def give_back(self, c, backend=None):
        """The product `c` (NumPy or CuPy) as the caller's kind: `out` as the
        caller passed it (filled where `c` is not it); else the kind of
        :attr:`home` where its library wraps it without a copy, on its GPU
        (a product made in host memory goes there where it fits, else stays
        in host memory with a RuntimeWarning), or NumPy/CuPy; in
        :attr:`result_dtype` where it has one."""
        if self.result_dtype is not None:
            c = exactly(c, self.result_dtype)
        if self.out is not None:
            if c is not self.out.array:
                _copy_into(self.out, c)
            return self.out.source
        home = self.home
        if home.device is not None and isinstance(c, np.ndarray):
            moved = _to_device(c, home.device, backend)
            if moved is None:
                warnings.warn(f"the product ({c.nbytes / 2**30:.2f} GiB) does not fit in the "
                              f"free memory of GPU {home.device}, where the operands lie; it "
                              "is returned in host memory", RuntimeWarning,
                              stacklevel=_callers_level())
                return as_kind(home.library, c) if home.library == "torch" else c
            c = moved
        return as_kind(home.library, c)


def exactly(c, dtype: np.dtype):
    """The float64 product `c` (NumPy or CuPy) of integers, exact, in the
    integer or boolean `dtype`: through int64, so that a narrower type keeps
    the low bits as NumPy's integer matmul does (bool: nonzero); `c` as it is
    where it is of `dtype` (converted already, as the product's chunks drained)."""
    # (host arrays on host threads: NumPy's astype takes one)
    cast = converted if isinstance(c, np.ndarray) else (lambda x, to: x.astype(to))
    whole = c if c.dtype == dtype or dtype.kind == "b" else cast(c, np.int64)
    return whole if dtype == whole.dtype else cast(whole, dtype)


def describe(a, b, out=None) -> Operands:
    """The caller's `a`, `b` and `out` (None: a new product) described
    (:func:`operand`), and checked together.

    Raises
    ------
    ValueError
        Either operand unusable (:func:`operand`); the two on different
        GPUs; `out` not where the product comes back (the operands' GPU,
        or host memory where both lie there), or not memory the product can
        be written into (a copy NumPy makes of it). An `out` it cannot be
        written into where it lies is filled at the end
        (:attr:`Operands.out_in_place`).
    """
    given = Operands(operand(a, "a"), operand(b, "b"), None if out is None else operand(out,
                                                                                          "out"))
    if given.a.device is not None and given.b.device is not None and \
            given.a.device != given.b.device:
        raise ValueError(f"a is on GPU {given.a.device} and b on GPU {given.b.device}: summa "
                         "multiplies operands that lie on one GPU or in host memory; move one")
    if given.out is not None:
        _check_out(given.out, given.home.device)
        given = replace(given, out_in_place=_in_place(given.out.array, given.a.array,
                                                      given.b.array))
    return given


def _in_place(out, a, b) -> bool:
    """Can the product be written into `out` (NumPy or CuPy) where it lies
    while `a` and `b` are read (:attr:`Operands.out_in_place`)?"""
    return out.ndim != 2 or not not_in_place(out, a, b)  # (not 2-D: refused by name)


def _check_out(out: Operand, device: int | None) -> None:
    """Refuse an `out` the product cannot be written into in place, or that
    lies elsewhere than the product comes back (`device`; None: host)."""
    if out.library == "jax":  # on a GPU CuPy would write into it all the same
        raise ValueError("out is read-only (JAX's arrays are immutable): leave out out, "
                         "and summa returns a JAX array")
    # A view gives the same memory each time it is asked for; a copy, new memory.
    if out.array is not out.source and out.device is None and not np.may_share_memory(
            out.array, _host_array(out.source, "out", not _array_like(out.source))):
        raise ValueError(f"out must be a NumPy array, a GPU array, or an array NumPy views "
                         f"in place (the product is written into it), not {out.kind}")
    if out.device != device:
        here = "in host memory" if out.device is None else f"on GPU {out.device}"
        there = "in host memory" if device is None else f"on GPU {device}"
        raise ValueError(f"out is {here}, but the product of these operands comes back "
                         f"{there}: pass out {there}")


def _gemm_reads(x) -> bool:
    """Does cuBLAS read the GPU array `x` as it lies (unit stride along rows
    or along columns)? Else the GEMM copies it (counted by the planner)."""
    rows, cols = x.shape if x.ndim == 2 else (0, 0)
    item = x.itemsize
    rows_unit = (cols <= 1 or x.strides[1] == item) and x.strides[0] >= 0
    columns_unit = (rows <= 1 or x.strides[0] == item) and x.strides[1] >= 0
    return x.ndim != 2 or x.size == 0 or rows_unit or columns_unit


def _to_device(c: np.ndarray, device: int, backend=None):
    """`c` copied to GPU `device` (staged through `backend` where it runs
    there), or None where its free memory cannot hold it."""
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device):
        free = cupy.cuda.runtime.memGetInfo()[0] + cupy.get_default_memory_pool().free_bytes()
        if c.nbytes > free:
            return None
        try:
            if backend is not None and backend.is_gpu and backend.device == device:
                return backend.asarray(c)
            return cupy.asarray(c)
        except cupy.cuda.memory.OutOfMemoryError:
            return None


def _copy_into(out: Operand, c) -> None:
    """Write the product `c` into `out` (a product made in host memory into
    a GPU `out`: straight where `out` is contiguous; into a host `out` on
    host threads, whatever its layout)."""
    if out.device is None:
        parallel_copy(out.array, c)
        return
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(out.device):
        if isinstance(c, np.ndarray) and out.array.flags.c_contiguous:
            out.array.set(np.ascontiguousarray(c))
        else:
            out.array[...] = cupy.asarray(c)


def as_kind(library: str, c):
    """`c` (NumPy or CuPy) as `library`'s array where it wraps one without a
    copy (torch, JAX); else `c` itself. A library that refuses leaves `c`
    as it is, with a RuntimeWarning (the product is not lost)."""
    module = sys.modules.get(library)
    if module is None or library not in ("torch", "jax"):
        return c
    try:
        if library == "torch":
            return module.from_numpy(c) if isinstance(c, np.ndarray) else module.from_dlpack(c)
        return importlib.import_module("jax.dlpack").from_dlpack(c)
    except Exception as exc:  # noqa: BLE001 -- the product is returned all the same
        warnings.warn(f"{library} could not take the product ({type(exc).__name__}: {exc}); "
                      f"it is returned as {_kind(c)}", RuntimeWarning,
                      stacklevel=_callers_level())
        return c


def _callers_level() -> int:
    """The `stacklevel` of the first frame outside summa, for a warning
    raised by the function calling this one: it points at the caller's line,
    whichever way the call came in (the pool, the grid, the stateful Matmul)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


@contextlib.contextmanager
def kept_device():
    """Inside, CuPy's current device may change (a backend binds its GPU);
    on leaving, the caller's is current again. Nothing where CuPy is not
    imported (no GPU array was passed, none made)."""
    cupy = sys.modules.get("cupy")
    try:
        device = cupy.cuda.runtime.getDevice() if cupy is not None else None
    except Exception:  # noqa: BLE001 -- CuPy without a usable device: nothing to keep
        device = None
    try:
        yield
    finally:
        if device is not None:
            cupy.cuda.runtime.setDevice(device)
