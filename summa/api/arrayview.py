"""One array a caller hands to ``summa.matmul``, as summa reads it: the
library it came from, where it lies (host memory or which CUDA GPU), and a
NumPy or CuPy array over its memory.

:func:`operand` views each argument once, where the call enters: it becomes
an :class:`Operand`, a NumPy array over the caller's host memory or a CuPy
array over the caller's GPU memory (no copy either way where the library
lets us view it), with the GPU it lies on and the library whose array it
was. The operands of one product together, and the product given back as
the caller's kind, are :mod:`summa.api.operands`'.

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
* Lazy conjugates (torch's conjugate bit): read as the op of the data as
  they lie (:func:`unconjugated`).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

import numpy as np

from ..device.backend import DTYPES
from ..host.copies import converted

__all__ = ["Operand", "operand", "unconjugated", "cupy_module", "library_of", "lies_on_gpu",
           "lazy_conjugate", "kind_of", "array_like", "host_array", "DLPACK_CPU", "DLPACK_CUDA"]

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


def kind_of(x) -> str:
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
            raise ValueError(f"{name} ({kind_of(x)}) lies on a {where} device, which summa "
                             "cannot use: pass it in host memory or on a CUDA GPU")
        return _on_gpu(x, name)
    if place is None and _has_cuda_interface(x):
        return _on_gpu(x, name)
    return Operand(x, _native(host_array(x, name, place is not None), name), None,
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
        raise ValueError(f"{name} ({kind_of(x)}) does not say where its data lie "
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
        raise ValueError(f"{name} ({kind_of(x)}) lies on a GPU, but CuPy is not installed here: "
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
                         f"{name} ({kind_of(x)}) lies on a GPU this process cannot read through "
                         f"CuPy ({type(exc).__name__}: {exc})") from None
    return Operand(x, array, device, library_of(x))


def array_like(x) -> bool:
    """Does NumPy view `x` by a protocol of its own (not DLPack)?"""
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__") or \
            isinstance(x, (list, tuple)):
        return True
    try:
        memoryview(x)
        return True
    except TypeError:
        return False


def host_array(x, name: str, dlpack: bool) -> np.ndarray:
    """`x` in host memory as a NumPy array: a view where its library gives
    one (``__array__``, the buffer protocol; DLPack where it has no other)."""
    if isinstance(x, (str, bytes)) or not (dlpack or array_like(x)):
        raise ValueError(f"{name} is not an array ({kind_of(x)})")
    try:
        array = np.from_dlpack(x) if dlpack and not array_like(x) else np.asarray(x)
    except Exception as exc:  # noqa: BLE001 -- any library's refusal, said once
        raise ValueError(_foreign_dtype(x, name) or
                         f"{name} is not an array NumPy can read ({kind_of(x)}: "
                         f"{type(exc).__name__}: {exc})") from None
    if array.dtype.hasobject:
        raise ValueError(f"{name} is not an array of numbers ({kind_of(x)})")
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
