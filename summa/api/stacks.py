"""Stacks of matrices, multiplied as NumPy's matmul multiplies them: an
operand of more than two dimensions is a stack of matrices in its last two,
the stacks' leading dimensions broadcast against each other, and each pair
of matrices is one product. The products are one :class:`summa.Matmul`
planned once for the shape every pair shares, executed for each pair into
its place in one result (the caller's kind of array, or `out`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import numpy as np

from ..planning.checks import op_shape
from ..host.copies import parallel_copy
from ..runtime.agree import Failure, from_root
from .arrayview import lazy_conjugate, library_of, lies_on_gpu, operand
from .operands import as_kind, describe, exactly
from .planned import ndim_of
from .promotion import product_type, promoted

__all__ = ["Stack", "stacked", "multiply_stack"]


@dataclass(frozen=True)
class Stack:
    """How two operands, one or both of more than two dimensions, stack.

    Attributes
    ----------
    batch : tuple of int
        The broadcast leading dimensions: one product for each index.
    a_batch, b_batch : tuple of int
        Each operand's own leading dimensions (empty for a matrix or a vector).
    shape : tuple of int
        The result's: `batch`, then one product's (NumPy's: a 1-D operand's
        dimension dropped).
    library : str or None
        On the root, where the stacks were converted once into the type the
        products are computed in (:func:`computed`): the library whose kind
        of array the result is given back as.
    result_dtype : numpy.dtype or None
        Where that type is float64 for integers: the result's type.
    """

    batch: tuple
    a_batch: tuple
    b_batch: tuple
    shape: tuple
    library: str | None = None
    result_dtype: np.dtype | None = None

    @property
    def count(self) -> int:
        """How many products it holds."""
        return int(np.prod(self.batch, dtype=np.int64))

    def indices(self) -> list:
        """``(index in the result, index in a, index in b)`` of each product,
        in C order: an operand's dimension of one is broadcast (index 0)."""
        return [(index, _taken(index, self.a_batch), _taken(index, self.b_batch))
                for index in np.ndindex(*self.batch)]


def _taken(index: tuple, own: tuple) -> tuple:
    """The index into an operand whose leading dimensions are `own` (aligned
    on the right with the batch's) of the batch's `index`."""
    skip = len(index) - len(own)
    return tuple(0 if size == 1 else index[skip + i] for i, size in enumerate(own))


def stackable(x, name: str):
    """`x` as an array with a shape and indexing: the caller's own where it
    has both (NumPy, CuPy, torch, JAX), else NumPy's view or copy (lists,
    buffer-protocol objects).

    Raises
    ------
    ValueError
        `x` is not an array NumPy reads (:func:`summa.api.arrayview.operand`).
    """
    if hasattr(x, "shape") and hasattr(x, "__getitem__") and \
            not isinstance(x, (list, tuple, memoryview)):
        return x
    return operand(x, name).array


def stacked(a, b, out, trans: tuple, comm, root: int) -> tuple:
    """``(stack, a, b, result)``: the :class:`Stack` of the root's `a` and
    `b` (:func:`stack_of`; None where they are matrices or vectors, `a` and
    `b` then as passed), the same on every rank of `comm`; on the root, `a`
    and `b` as :func:`stackable` gives them, and where the stack holds no
    product (:attr:`Stack.count` 0) its empty result. Operands of two
    dimensions or fewer are not converted (their checks are the product's).
    Raises the root's ValueError on every rank."""
    stack = result = None
    if comm.Get_rank() == root and max(ndim_of(a), ndim_of(b)) > 2:
        try:
            a, b = stackable(a, "a"), stackable(b, "b")
            stack = stack_of(a, b, out, trans)
            if not stack.count:
                result = out if out is not None else _empty(stack, a, b)
            else:
                stack, a, b = computed(stack, a, b)
        except Exception as exc:  # noqa: BLE001 -- raised on every rank below
            stack = Failure.of(exc)  # (what the root decided: a stack, or its failure)
    return from_root(comm, root, stack), a, b, result


def computed(stack: Stack, a, b) -> tuple:
    """``(stack, a, b)``: where the stacks' types differ or are integers,
    both converted once into the type the products are computed in
    (:func:`summa.api.promotion.promoted`: NumPy or CuPy arrays where they
    lie; `stack` then says whose kind and which type the result is given
    back as), not again for each pair; else as they are (a lazy conjugate
    too: each pair is converted then).

    Raises
    ------
    ValueError
        The conversion does not fit in memory, or integers float64 cannot
        sum exactly."""
    kinds = (_dtype(a), _dtype(b))
    if (kinds[0] == kinds[1] and kinds[0].kind not in "biu") or \
            lazy_conjugate(a) or lazy_conjugate(b):
        return stack, a, b
    given = promoted(describe(a, b))
    home = b if lies_on_gpu(b) and not lies_on_gpu(a) else a
    stack = replace(stack, library=library_of(home), result_dtype=given.result_dtype)
    return stack, given.a.array, given.b.array


def stack_of(a, b, out, trans: tuple) -> Stack | None:
    """The :class:`Stack` of the root's `a` and `b` (:func:`stackable`),
    None where neither has more than two dimensions (a product of matrices
    or vectors); `out` (None: a new result) and the ops `trans` checked
    against it.

    Raises
    ------
    ValueError
        The leading dimensions do not broadcast, the matrices cannot be
        multiplied, or `out` is not of the result's shape.
    """
    if max(len(a.shape), len(b.shape)) <= 2:
        return None
    for name, t in zip(("trans_a", "trans_b"), trans):
        if t not in ("N", "T", "H"):
            raise ValueError(f"{name} must be N, T or H, got {t!r}")
    own = [tuple(int(s) for s in x.shape[:-2]) for x in (a, b)]
    try:
        batch = tuple(np.broadcast_shapes(*own))
    except ValueError:
        raise ValueError(f"a stacks matrices {own[0]} and b {own[1]}: the leading dimensions "
                         "do not broadcast (NumPy's rule: equal, or one of them 1)") from None
    shape = batch + _matrix_shape(a, b, trans)
    if out is not None and tuple(getattr(out, "shape", ())) != shape:
        raise ValueError(f"out must be of the stack's product's shape {shape}, got "
                         f"{tuple(getattr(out, 'shape', ()))}")
    return Stack(batch, *own, shape)


def _matrix_shape(a, b, trans: tuple) -> tuple:
    """The shape of one product of `a`'s and `b`'s pairs (NumPy's: a 1-D
    operand's dimension dropped), their inner dimensions checked."""
    ka = op_shape(a.shape[-2:], trans[0])[1] if len(a.shape) > 1 else a.shape[0]
    kb = op_shape(b.shape[-2:], trans[1])[0] if len(b.shape) > 1 else b.shape[0]
    if ka != kb:
        raise ValueError(f"inner dimensions differ: op(a)'s matrices have {ka} columns, "
                         f"op(b)'s {kb} rows")
    rows = () if len(a.shape) == 1 else (op_shape(a.shape[-2:], trans[0])[0],)
    columns = () if len(b.shape) == 1 else (op_shape(b.shape[-2:], trans[1])[1],)
    return tuple(int(x) for x in rows + columns)


def multiply_stack(stack: Stack, a, b, out, comm, root: int, make_matmul):
    """The products of `stack`'s pairs (one or more) of `a` and `b`, each
    into its place in `out` or a new result; collective over `comm`.
    Returns ``(the result on the root (None elsewhere), the SummaStats of
    the last product)``, its ``product_finite`` False where any was not.

    Parameters
    ----------
    stack : Stack
        The same on every rank.
    a, b, out : array or None
        On `root`: the operands and `out` (of the result's shape) as
        :func:`stacked` gives them, else None.
    make_matmul : callable
        ``make_matmul(a, b)`` -> a :class:`summa.Matmul` of one pair (None,
        None off the root), executed for every pair.
    """
    on_root = comm.Get_rank() == root
    pairs = stack.indices()
    _, ia, ib = pairs[0]
    with make_matmul(*((a[ia], b[ib]) if on_root else (None, None))) as matmul:
        result = returned = failure = None
        if on_root:
            try:  # (integers' products go into float64, converted at the end)
                result, returned = (out, out) if out is not None and \
                    stack.result_dtype is None else _new(stack, a, b, matmul.plan)
            except Exception as exc:  # noqa: BLE001 -- raised on every rank below
                failure = Failure.of(exc)
        from_root(comm, root, failure)
        finite = True
        for at, ia, ib in pairs:
            matmul.execute(*((a[ia], b[ib], result[at]) if on_root else (None, None, None)))
            finite = finite and (matmul.stats.extra or {}).get("product_finite") is not False
        stats = matmul.stats
    if not finite:
        stats.extra = dict(stats.extra or {}, product_finite=False)
    if on_root and stack.result_dtype is not None:
        returned = _exact(result, stack, out)
    return returned, stats


def _exact(result, stack: Stack, out):
    """The float64 `result` of integer stacks in their result type, into
    `out` where given, else as the caller's kind."""
    final = exactly(result, stack.result_dtype)
    if out is None:
        return as_kind(stack.library, final)
    place = operand(out, "out").array
    if isinstance(place, np.ndarray):
        parallel_copy(place, final)
    else:
        place[...] = final
    return out


def _new(stack: Stack, a, b, plan) -> tuple:
    """``(result, returned)``: a new result for the products of `plan` (a
    pair's), NumPy in host memory or CuPy on the operands' GPU, and it as
    the kind of the operand whose kind the product takes (torch's, JAX's
    where they wrap it without a copy).

    Raises
    ------
    ValueError
        It does not fit in that GPU's free memory."""
    shape, dtype = stack.shape, product_type(_dtype(a), _dtype(b)) or np.dtype(plan.dtype)
    placement = plan.placement
    home = b if placement.where == "mixed" and not lies_on_gpu(a) else a
    library = stack.library or library_of(home)
    if placement.where == "host":
        return _kept(np.empty(shape, dtype), library)
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(placement.device):
        try:
            return _kept(cupy.empty(shape, dtype), library)
        except cupy.cuda.memory.OutOfMemoryError:
            raise ValueError(f"the stack's product ({np.prod(shape) * dtype.itemsize / 2**30:.2f}"
                             f" GiB) does not fit in the free memory of GPU "
                             f"{placement.device}, where its products come back: pass out= "
                             "(on that GPU), or multiply the matrices in calls of their "
                             "own") from None


def _kept(result, library: str) -> tuple:
    return result, as_kind(library, result)


def _dtype(x) -> np.dtype:
    """The NumPy dtype of the array `x` of any library (torch's by name)."""
    return np.dtype(str(x.dtype).rpartition(".")[2])


def _empty(stack: Stack, a, b):
    """The result of a stack of no products: an empty array of NumPy's result
    type, in host memory or on the GPU an operand lies on.

    Raises
    ------
    ValueError
        The dtypes have no common type summa multiplies."""
    dtypes = [_dtype(x) for x in (a, b)]
    dtype = product_type(*dtypes)
    if dtype is None:
        raise ValueError(f"a is {dtypes[0].name} and b {dtypes[1].name}: NumPy's type for "
                         "their product is not one summa multiplies")
    shape = stack.shape
    gpu = next((x for x in (a, b) if lies_on_gpu(x)), None)
    if gpu is None:
        return as_kind(library_of(a), np.empty(shape, dtype))
    device = operand(gpu, "the operand").device
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(device):
        return as_kind(library_of(gpu), cupy.empty(shape, dtype))
