"""The products of arrays and DistMatrix operands: ``summa.matmul``.

:func:`matmul` takes NumPy arrays (or any host or GPU array) held on one
rank, or DistMatrix operands; :func:`matmul_arrays` multiplies arrays
(planned and run by :mod:`summa.api.planned`, on the ranks of a communicator
or a plain process's pool), :func:`host_matmul` host-held DistMatrix
operands on the GPUs. The ``.npy`` files workflow is
:mod:`summa.api.files`."""

from __future__ import annotations

import inspect
import time
import warnings

import numpy as np

from ..runtime.mpi import MPI
from ..runtime.agree import collectively
from ..execution.algorithm import SummaStats, gemm
from ..device.backend import NumpyBackend, get_backend
from ..distribution.grid import ProcessGrid
from .. import options as settings
from .. import pool
from ..planning.checks import check_operands
from ..distribution.layout import Layout
from .operands import kept_device
from ..distribution.matrix import DistMatrix
from ..execution.outofcore import SweepOperands, run_out_of_core
from ..precision.ozaki_gpu import check_moduli
from ..planning.precision import asked_moduli
from ..planning.plan import Machine
from ..planning.planner import make_plan
from ..planning.sweepsetup import prepared_sweep
from .nonfinite import nonfinite_notes
from .stacks import Stack, multiply_stack, stacked
from .stateful import Matmul
from ..execution.jobprogress import library_reporting
from ..planning.arrays import plan_held
from ..planning.request import PlanRequest
from .planned import ArrayOperands, plan_arrays, pooled_size, run_planned, vector_result

__all__ = ["matmul", "matmul_arrays", "host_matmul"]


#: Options matmul on arrays passes on to the multiply (the rest are its own).
_MATMUL_OPTIONS = ("alpha", "trans_a", "trans_b", "panel_width", "lookahead", "broadcaster",
                   "precision", "moduli", "schedule", "stats")


@settings.entry_point
def matmul_arrays(a, b, comm: MPI.Comm | None = None, root: int = 0, grid=None,
                  backend="auto", out=None, out_of_core=None, device_memory=None,
                  gpus=None, workers=None, topology=None, **kwargs):
    """``alpha * op(a) @ op(b)`` for arrays held on rank `root` (None
    elsewhere), returned as the caller's kind of array; collective.

    Host arrays stay where they lie, whatever their order or strides (the
    plan's ``storage``, :mod:`summa.host.storage`), and on GPUs stream through
    them in tiles (:mod:`summa.execution.outofcore`); on several ranks the root
    scatters the blocks (or the ranks read them in place) and gathers the
    product. GPU arrays on one rank are one GEMM there, queued on the current
    stream as ``cupy.matmul`` is, where the product fits; elsewhere they go
    through host memory (the plan's note says why) and the product back to
    their GPU. The whole rule: docs/user-guide.md, "Arrays you can pass".

    Parameters
    ----------
    a, b : array
        On `root`, of one dtype (float64, float32, complex128, complex64;
        float16 on GPUs), or of two whose common type (NumPy's
        ``result_type``) is one of these: the other operand is copied once
        into it (:mod:`summa.api.promotion`); or both integer or boolean,
        multiplied exactly (in float64, below 2**53) and given back in
        NumPy's result type; never modified. NumPy arrays;
        host arrays of other libraries NumPy views in place (``__array__``, the buffer protocol,
        DLPack on the CPU: torch CPU tensors, memoryviews) and lists; arrays
        on one CUDA GPU: CuPy's, and DLPack or CUDA-array-interface
        producers (torch CUDA tensors, JAX arrays), viewed through CuPy.
        2-D, or 1-D as NumPy's matmul takes a vector (a row on the left, a
        column on the right; the product drops that dimension), or stacks
        of matrices in their last two dimensions, the leading ones
        broadcast as NumPy's matmul does: one Matmul planned for a pair and
        executed for each (:mod:`summa.api.stacks`).
    grid : str or tuple, optional
        Default: the one ``bench`` takes for the product's shape
        (:func:`summa.distribution.grid.grid_for`).
    out : array, optional
        On `root`: where the product goes, of its shape and dtype, where the
        product comes back (the operands' GPU; host memory where both lie
        there), returned as passed. Written in place where its rows are
        contiguous and it overlaps neither operand; a Fortran-ordered NumPy
        or CuPy `out` of such operands gets ``op(b)^T @ op(a)^T`` in its
        transpose (the same values, in place; not for op H of complex
        operands); any other `out` is filled from a product of its own at
        the end, in host memory or on its GPU
        (:attr:`summa.api.operands.Operands.out_in_place`). Where the call
        raises, its values are undefined.
    out_of_core : bool, optional
        None (default): host-resident on GPUs as above; False: copy the
        operands into GPU memory first (the in-memory SUMMA); True:
        host-resident on CPUs too (tests), GPU operands through host memory.
    device_memory : str, optional
        Cap on each rank's GPU memory, e.g. "16GiB" (default: 90 % of what
        is free); GPU operands count against it.
    gpus, workers : int, optional
        In a plain Python process (no launcher, no `comm`): the pool of
        worker ranks (:mod:`summa.pool`): `gpus` (``SUMMA_GPUS``; default
        every visible GPU for host arrays, the operands' own for GPU arrays),
        or without GPUs `workers` (``SUMMA_WORKERS``; default one per 8
        cores). One means this process alone.
    topology : summa.distribution.topology.Topology, optional
        The nodes of `comm`'s ranks (default: as MPI sees them).
    **kwargs
        ``alpha``, ``trans_a``, ``trans_b``, ``panel_width``, ``lookahead``,
        ``broadcaster`` (``"host"``: with node-shared operands every GPU
        uploads its own panel parts), ``precision``, ``moduli`` (with
        ``precision="fp64-int8"``: INT8 products per float64 product, 3-30),
        ``schedule``, ``stats`` (a SummaStats filled with this rank's timings
        and ``extra["plan"]``; see :func:`summa.gemm`).
    options : summa.options.Options, optional
        The settings (default: the current ones, from ``SUMMA_*`` variables
        read once here; docs/options.md); a pool's workers get them too.

    Returns
    -------
    array or None
        The product on `root` (None elsewhere): `out` where given; else the
        kind of `a` (of the GPU operand where only one is) where its library
        wraps it without a copy: torch's tensors, JAX's arrays; else CuPy
        for GPU arrays, NumPy for host arrays. A product made in host memory
        that does not fit in the GPU's free memory stays in host memory
        (NumPy, or a torch CPU tensor), with a RuntimeWarning.

    Raises
    ------
    ValueError
        The same on every rank, before any data moves: arrays that cannot be
        multiplied (not arrays, stacks whose leading dimensions do not
        broadcast, dtypes unsupported or of no common type summa
        multiplies, integers whose sums float64 would round, a promoted
        copy beyond the memory, inner dimensions differing), operands on two GPUs or not on a CUDA
        GPU, GPU arrays without CuPy, an unusable `out`, a device budget too
        small for any tile, a host too small for the plan.
    """
    called = time.perf_counter()
    unknown = sorted(set(kwargs) - set(_MATMUL_OPTIONS))
    if unknown:
        raise TypeError(f"matmul got unexpected keyword argument(s) {', '.join(unknown)}")
    moduli = check_moduli(kwargs.pop("moduli", None), kwargs.get("precision"))
    trans = tuple(str(kwargs.pop(f"trans_{x}", "N")).upper() for x in "ab")
    stack, a, b, empty = stacked(a, b, out, trans, MPI.COMM_WORLD if comm is None else comm,
                                 root)
    if stack is not None:
        here = dict(kwargs, trans_a=trans[0], trans_b=trans[1], moduli=moduli, comm=comm,
                    root=root, grid=grid, backend=backend, out_of_core=out_of_core,
                    device_memory=device_memory, gpus=gpus, workers=workers, topology=topology)
        return _matmul_stack(stack, a, b, out, here) if stack.count else empty
    operands, trans, vectors = ArrayOperands(a, b, out, root).taken(trans)
    # (a Fortran-ordered out: the transposed product into out.T; the root's ops rule)
    operands, (trans_a, trans_b) = operands.into_transposed_out(trans)
    here = dict(kwargs, trans_a=trans_a, trans_b=trans_b, grid=grid, backend=backend,
                out_of_core=out_of_core, device_memory=device_memory)
    # The backend binds its GPU; the caller's current one is current again after.
    with asked_moduli(moduli), kept_device():  # the pool's workers get moduli with the rest
        size, operands = pooled_size(operands, comm, gpus, workers, backend)
        if size > 1:
            host_a, host_b, host_out = operands.given.host_arrays()
            c = operands.given.give_back(pool.matmul(host_a, host_b, size, out=host_out,
                                                     **here))
        else:
            c = _matmul_here(operands, MPI.COMM_WORLD if comm is None else comm, called,
                             dict(here, topology=topology))
    return vector_result(c, vectors, out)


def _matmul_stack(stack: Stack, a, b, out, kwargs: dict):
    """:func:`matmul_arrays` of stacks of matrices (:mod:`summa.api.stacks`):
    one Matmul of a pair, planned once, executed for each; `kwargs` its
    other arguments. `stats` gets the last product's record."""
    stats = kwargs.pop("stats", None)
    comm = MPI.COMM_WORLD if kwargs["comm"] is None else kwargs["comm"]
    c, last = multiply_stack(stack, a, b, out, comm, kwargs["root"],
                             lambda x, y: Matmul(x, y, **kwargs))
    if stats is not None and last is not None:
        stats.__dict__.update(last.__dict__)
    return c


def _matmul_here(operands: ArrayOperands, comm, called: float, kwargs: dict):
    """:func:`matmul_arrays` on the ranks of `comm` (no pool), `kwargs` its
    other arguments: check and plan, run, give the product back."""
    alpha, stats = kwargs.pop("alpha", 1.0), kwargs.pop("stats", None)
    backend, topology = kwargs.pop("backend", "auto"), kwargs.pop("topology", None)
    request = PlanRequest(**kwargs)
    be, plan, operands = plan_arrays(operands, comm, request, backend, topology)

    def again():  # the same planning with the memory free then (a run short of room)
        return plan_held(operands.given, comm, operands.root, request, backend, topology)[1]
    if plan.placement.resident:  # one GEMM where the operands lie: no grid to make
        return run_planned(plan, None, be, operands, alpha, stats, called, again)
    # (a long product on the ranks of the user's own launcher shows its line)
    with library_reporting(comm, plan), ProcessGrid(comm, plan.grid, topology=topology) as pgrid:
        if pgrid.core_note and pgrid.rank == 0:
            warnings.warn(pgrid.core_note, RuntimeWarning, stacklevel=2)
        return run_planned(plan, pgrid, be, operands, alpha, stats, called, again)


def matmul(A, B, device=None, **kwargs):
    """The product ``alpha * op(A) @ op(B)`` of NumPy arrays (on GPUs
    through host memory, on CPUs with NumPy) or of DistMatrix operands.

    Arrays go to :func:`matmul_arrays`, DistMatrix operands to
    :func:`summa.gemm`, host-held DistMatrix operands with a GPU `device`
    to :func:`host_matmul`; each takes the keyword arguments below that
    apply to it.

    Parameters
    ----------
    A, B : array or DistMatrix
        Arrays held on rank `root` (None on the others; in a plain Python
        process, just the arrays), never modified: NumPy arrays, host arrays
        of other libraries (torch CPU tensors, anything with ``__array__``,
        the buffer protocol or DLPack), and arrays on a CUDA GPU (CuPy
        arrays, torch CUDA tensors, JAX arrays, anything with DLPack or
        ``__cuda_array_interface__``), read where they lie; or DistMatrix
        operands on one grid.
    device : Backend or str, optional
        Host-held DistMatrix operands only: the GPU they stream through in
        tiles (``"auto"``/``"cupy"``: the rank's GPU).
    alpha : scalar, default 1.0
    trans_a, trans_b : {"N", "T", "H"}, default "N"
        op of each operand; ``H`` is the conjugate transpose.
    out : numpy.ndarray, optional
        Arrays: where the product goes on `root` (its shape and dtype,
        contiguous rows, overlapping neither operand); returned.
    comm : MPI.Comm, optional
        Arrays: the ranks that multiply (default COMM_WORLD).
    root : int, default 0
        Arrays: the rank that holds them and gets the product.
    grid : str or tuple, optional
        Arrays: the process grid, e.g. ``"2x4"`` (default: bench's for the
        product's shape).
    backend : str, default "auto"
        Arrays: ``"auto"`` (GPUs where there are), ``"cupy"`` or ``"numpy"``.
    gpus, workers : int, optional
        Arrays in a plain Python process: the pool of worker ranks it runs
        on (default every visible GPU; without GPUs one worker per 8 cores).
    out_of_core : bool, optional
        Arrays: None (default) keeps them in host memory on GPUs; False
        copies them into GPU memory first; True: host-resident on CPUs too.
    device_memory : str, optional
        Cap on each GPU's memory, e.g. ``"16GiB"`` (default 90 % of free).
    panel_width : int or "auto", optional
        Panel width along K (default: by backend, dtype and mode).
    lookahead : int, default 1
    broadcaster : str, default "auto"
        ``"auto"``, ``"ipc"``, ``"nccl"``, ``"cuda-aware"``, ``"mpi"``, or
        for arrays ``"host"`` (every GPU uploads the panel parts it needs).
    precision : str, optional
        ``"tf32"`` (float32 on tensor cores) or ``"fp64-int8"`` (float64
        from INT8 products).
    moduli : int, optional
        With ``precision="fp64-int8"``: INT8 products per float64 one (3-30).
    schedule : str, default "panels"
        ``"panels"`` or ``"strips"`` (grids of one column).
    stats : SummaStats, optional
        Filled with this rank's timings.
    topology : summa.distribution.topology.Topology, optional
        Arrays: the nodes of `comm`'s ranks (tests: virtual nodes).
    options : summa.options.Options, optional
        The settings (default: the current ones; docs/options.md).
    C, beta, progress
        DistMatrix operands: as for :func:`summa.gemm`.

    Returns
    -------
    array, DistMatrix or None
        Arrays, on `root`: the product as the caller's kind where its
        library can wrap it (a CuPy array on the operands' GPU for CuPy
        operands, a torch tensor for torch's, a JAX array for JAX's), else
        NumPy (host arrays) or CuPy (GPU arrays); `out` where given; None on
        the other ranks. DistMatrix operands: a new DistMatrix.

    Warns
    -----
    RuntimeWarning
        Arrays, where the product has NaN/Inf (the run checks it as it goes):
        which operand holds how many NaN/Inf values, or that the product
        overflowed, as ``summa multiply`` warns of its files; the operands
        are counted only then.

    Examples
    --------
    >>> c = matmul(a, b)  # doctest: +SKIP
    >>> c = matmul(a if rank == 0 else None, b if rank == 0 else None)  # doctest: +SKIP
    >>> C = matmul(A_host, B_host, device="auto")  # doctest: +SKIP
    >>> c_gpu = matmul(cupy.asarray(a), cupy.asarray(b))  # one GEMM on that GPU  # doctest: +SKIP
    """
    if isinstance(A, DistMatrix) or isinstance(B, DistMatrix):
        if device is not None and isinstance(A, DistMatrix) and not A.backend.is_gpu:
            return host_matmul(A, B, device, **kwargs)
        return gemm(A, B, **kwargs)
    if device is not None:
        raise TypeError("device applies to host-held DistMatrix operands; for arrays give "
                        "backend= (GPU arrays are multiplied on the GPU they lie on)")
    return _warned(A, B, kwargs)


def _matmul_signature() -> inspect.Signature:
    """What :func:`matmul` takes, for ``help()`` and ``inspect``: its
    keywords pass on to :func:`matmul_arrays`, :func:`summa.gemm` or
    :func:`host_matmul`, which check them (each takes those that apply)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    defaults = {"alpha": 1.0, "trans_a": "N", "trans_b": "N", "out": None, "comm": None,
                "root": 0, "grid": None, "backend": "auto", "gpus": None, "workers": None,
                "out_of_core": None, "device_memory": None, "panel_width": None,
                "lookahead": 1, "broadcaster": "auto", "precision": None, "moduli": None,
                "schedule": "panels", "stats": None, "topology": None, "options": None,
                "C": None, "beta": 0.0, "progress": None}
    positional = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    **({"default": None} if name == "device" else {}))
                  for name in ("A", "B", "device")]
    return inspect.Signature(positional + [inspect.Parameter(name, keyword, default=value)
                                           for name, value in defaults.items()])


matmul.__signature__ = _matmul_signature()


def _warned(a, b, kwargs: dict):
    """:func:`matmul_arrays` of `a` and `b`, warning at the caller's caller's
    line where the product has NaN/Inf (the run says whether it has)."""
    stats = kwargs.get("stats") or SummaStats()
    c = matmul_arrays(a, b, **dict(kwargs, stats=stats))
    if c is not None and (stats.extra or {}).get("product_finite") is False:
        for note in nonfinite_notes({"a": a, "b": b}, np.dtype(c.dtype)):
            warnings.warn(note, RuntimeWarning, stacklevel=3)
    return c


@settings.entry_point
def host_matmul(A: DistMatrix, B: DistMatrix, device, alpha=1.0, trans_a="N", trans_b="N",
                panel_width=None, lookahead: int = 1, broadcaster: str = "auto",
                precision=None, device_memory=None, stats: SummaStats | None = None,
                moduli: int | None = None) -> DistMatrix:
    """``alpha op(A) @ op(B)`` of host-held DistMatrix operands on the GPUs
    (`device`), A, B and the new C staying in host memory; collective.

    Plans against the free device memory (or `device_memory`, e.g. "16GiB")
    and takes the fewest C tiles that fit, one where everything does; a
    transposed operand is redistributed on the host first. Raises the same
    ValueError on every rank for operands that cannot be multiplied, a device
    budget too small for any tile, or a host too small for the plan.
    `options` (a :class:`summa.options.Options`) are the settings (default:
    the current ones).
    """
    if not isinstance(B, DistMatrix) or B.backend.is_gpu:
        raise ValueError("host_matmul needs both operands host-held (NumPy backend)")
    moduli = check_moduli(moduli, precision)
    grid = A.grid
    if isinstance(device, str):
        device = collectively(grid.comm, get_backend, device, grid.local_rank)
    ops = [str(t).upper() for t in (trans_a, trans_b)]
    for name, t in zip(("trans_a", "trans_b"), ops):
        if t not in ("N", "T", "H"):
            raise ValueError(f"{name} must be N, T or H, got {t!r}")
    check_operands(A, B, None, *ops)
    opA, opB = (X if t == "N" else X.transpose(conj=t == "H" and X.dtype.kind == "c")
                for X, t in ((A, ops[0]), (B, ops[1])))
    m, k = opA.shape
    n = opB.shape[1]
    # (opA and opB come redistributed and conjugated: the plan's conj is False)
    plan = make_plan((m, n, k), opA.dtype, Machine.live(grid.comm, device),
                     PlanRequest(grid=grid.shape, trans_a=ops[0], trans_b=ops[1],
                                 out_of_core=True, device_memory=device_memory,
                                 panel_width=panel_width, lookahead=lookahead,
                                 precision=precision, broadcaster=broadcaster), moduli=moduli)
    layout = Layout.from_distributions(opA.layout.rows, opB.layout.cols)
    C = DistMatrix(grid, layout, np.empty(layout.local_shape(grid.row, grid.col), opA.dtype),
                   NumpyBackend())
    operands = SweepOperands(opA, opB, C)
    with asked_moduli(moduli):  # (the plan made final with them; the products take its scheme)
        # its broadcasters made and the plan made final for them, then run
        plan, broadcasters = prepared_sweep(plan, operands, device)
        result = run_out_of_core(plan, operands, device, alpha=alpha, fresh_c=True,
                                 broadcasters=broadcasters)
    if stats is not None:
        stats.__dict__.update(result.__dict__)
    return C
