"""The operands of one ``summa.matmul`` call together, and the product
handed back as the caller's kind of array.

:func:`describe` normalises the operands once, where the call enters: each
becomes an :class:`summa.api.arrayview.Operand` (:func:`summa.api.arrayview.operand`),
and `out` is checked against where the product comes back. Their joint
:attr:`Operands.placement` is what the planner weighs
(:class:`summa.planning.plan.Placement`); :meth:`Operands.host_arrays` gives
them in host memory for a host plan; :meth:`Operands.give_back` turns the
product into the caller's kind.

The product comes back as CuPy or NumPy, or as the library's own array where
the library can wrap it without a copy: torch (``torch.from_dlpack``,
``torch.from_numpy``) and JAX (``jax.dlpack.from_dlpack``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from dataclasses import dataclass, replace

import numpy as np

from ..planning.checks import not_in_place
from ..host.copies import converted, parallel_copy
from ..planning.plan import Placement
from .arrayview import Operand, array_like, host_array, kind_of, operand
from .promotion import as_float64

__all__ = ["Operands", "describe", "kept_device", "as_kind", "exactly"]


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
            out.array, host_array(out.source, "out", not array_like(out.source))):
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
                      f"it is returned as {kind_of(c)}", RuntimeWarning,
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
