"""What a multiply was decided to be: the frozen, printable :class:`Plan`
that :func:`summa.planning.planner.make_plan` returns and the executors run
as it is, with what it is planned for: the :class:`Machine` (its ranks,
backend and free memory) and the operands' :class:`Placement`.

The decisions themselves are :mod:`summa.planning.planner`'s; the plan as
text (``str(plan)``) is :mod:`summa.planning.report`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..precision import ozaki_gpu
from ..distribution.topology import topology_of
from .memory import MemoryPlan
from .report import plan_lines

__all__ = ["Machine", "Placement", "Plan"]


@dataclass(frozen=True)
class Machine:
    """What :func:`summa.planning.planner.make_plan` knows of where the multiply runs.

    Attributes
    ----------
    backend : str
        ``"cupy"`` (GPUs) or ``"numpy"``.
    ranks : int
        Ranks that will multiply.
    free_device : int, optional
        Bytes free on each rank's device, where known without asking (a
        machine planned from afar); None: unknown, nothing checked against it.
    ranks_on_node : int, optional
        Ranks on this rank's node, which share its cores (the host copy
        threads divide them: :func:`summa.device.staging.copy_threads`);
        None: all `ranks` on one node, as a machine planned from afar is
        taken to be (``summa plan`` plans its broadcasts so too).
    comm, device : MPI.Comm and Backend, optional
        This machine (:meth:`live`): its ranks and their device, asked for
        their free memory and checked against the nodes' host memory.
    cores : int, optional
        A node's cores, which its ranks' host copy threads divide, where a
        profile says (a machine planned from afar); None: this process's.
    """

    backend: str = "numpy"
    ranks: int = 1
    free_device: int | None = None
    ranks_on_node: int | None = None
    comm: object = field(default=None, compare=False, repr=False)
    device: object = field(default=None, compare=False, repr=False)
    cores: int | None = None

    @classmethod
    def live(cls, comm, device, topology=None) -> "Machine":
        """The ranks of `comm` with their `device` (a Backend), their nodes
        as `topology` says (:class:`summa.distribution.topology.Topology`;
        default the one of `comm`, detected on a communicator's first use:
        collective then), as the process grid of the run will see them."""
        nodes = topology or topology_of(comm)
        return cls(device.name, comm.Get_size(), ranks_on_node=nodes.local_size, comm=comm,
                   device=device)

    @property
    def node_ranks(self) -> int:
        """Ranks sharing this rank's node (:attr:`ranks_on_node`, else all)."""
        return self.ranks_on_node or self.ranks


@dataclass(frozen=True)
class Placement:
    """Where the operands of a product lie when it is called, as the
    planner weighs them (:attr:`summa.api.operands.Operands.placement`), and in
    a Plan, whether the multiply reads them there.

    Attributes
    ----------
    where : str
        ``"host"`` (host memory), ``"device"`` (both on one GPU) or
        ``"mixed"`` (one on a GPU, the other in host memory).
    device : int or None
        The CUDA device the operands on a GPU lie on.
    held : int
        Bytes of the operands on the GPU: they count against a
        ``device_memory`` cap.
    copies : int
        Device bytes the GEMM needs for operands beside them: a host
        operand uploaded (mixed), one whose layout cuBLAS cannot read as it
        is (neither rows nor columns contiguous) copied.
    into_out : bool
        The product goes into the caller's array there (``out=``): no new C.
    fetched : bool
        In a Plan: the operands on the GPU are copied to host memory and the
        host plan runs (:attr:`Plan.note` says why); False where the multiply
        is one GEMM where they lie (:attr:`resident`).
    """

    where: str = "host"
    device: int | None = None
    held: int = 0
    copies: int = 0
    into_out: bool = False
    fetched: bool = False

    @property
    def resident(self) -> bool:
        """Is the multiply one GEMM on the GPU where the operands lie?"""
        return self.where != "host" and not self.fetched

    def __str__(self) -> str:
        if self.where == "host":
            return "operands in host memory"
        which = "operands" if self.where == "device" else "one operand (the other uploaded)"
        how = "copied to host memory first" if self.fetched else "multiplied there in one GEMM"
        return f"{which} on GPU {self.device}, {how}"


@dataclass(frozen=True)
class Plan:
    """Every decision of one multiply ``C = op(A) @ op(B)``, made before any
    data moves (:func:`summa.planning.planner.make_plan`).

    Attributes
    ----------
    shape : tuple
        ``(m, n, k)`` of the product.
    dtype : str
        The compute dtype.
    backend : str
        Where the GEMMs run: ``"cupy"`` or ``"numpy"``.
    ranks : int
    grid : tuple
        ``(Pr, Pc)``.
    trans : tuple
        ``(op of A, op of B)``: ``"N"``, ``"T"`` or ``"H"``.
    schedule : str
        ``"panels"`` or ``"strips"``.
    out_of_core : bool
        A, B and C stay in host memory and C goes through the device in
        tiles (:mod:`summa.execution.outofcore`); else all on the device.
    panel_width : int or str
        The width every panel takes; ``"auto"``: measured when the in-memory
        multiply starts (:func:`summa.planning.tuning.auto_panel_width`).
    lookahead : int
    precision : str or None
    moduli : int or None
        fp64-int8: INT8 products per float64 panel product.
    device_budget : int or None
        Out of core: device bytes per rank the tiles were cut to.
    memory : MemoryPlan
        Peak bytes per rank, and out of core the tiles, panel slots and
        staging the sweep runs as they are.
    broadcaster : str
        The broadcaster asked for (``auto`` resolves when the grid is made).
    host_copies : str or None
        Out of core on GPUs: how host blocks that are not page-locked reach
        the device, ``"stage"`` or ``"lock"`` (as asked, else
        ``SUMMA_HOST_COPIES``: :func:`summa.planning.make_plan`);
        None where nothing crosses a host link in tiles (CPUs, in memory).
    copy_threads : int or None
        Out of core on GPUs: host threads per rank that fill and drain the
        page-locked chunks of the host copies
        (:func:`summa.device.staging.copy_threads` of the ranks on a node,
        ``SUMMA_COPY_THREADS`` where set), whose ring
        ``memory.staging_bytes`` counts; of this rank, so the same on every
        rank where the nodes are alike. None where `host_copies` is.
    panel_sums : int or None
        fp64-int8 in memory on a grid: device bytes of the panel sums where
        this product may sum its panels' INT8 products (used where the
        device has them free when it starts); None where it cannot.
    placement : Placement
        Where the operands lie, and whether the multiply is one GEMM there
        (``placement.resident``: one rank, the operands on its GPU, no grid,
        no copy through host memory).
    storage : tuple
        ``(op(A)'s, op(B)'s)`` way of lying in host memory
        (:data:`summa.host.storage.STORAGES`): ``"rows"``, ``"cols"`` (read as
        its transpose's rows, taken by the GEMM as its transposed operand),
        or ``"strided rows"``/``"strided cols"`` (gathered by the host copy
        threads); the executors follow it and copy no operand whole.
    conj : tuple
        ``(A's, B's)``: do the GEMMs conjugate that operand
        (:meth:`summa.device.backend.Backend.gemm`: op H of a complex array handed
        over as it lies)? False where it comes conjugated (read so from a
        file, redistributed so) or op H does not conjugate (real dtypes).
    host_integers : tuple or None
        ``(A's, B's, the product's)`` dtype names where the operands are
        integers (or bools) lying in host memory that the host copy threads
        convert into float64 as they stage them into page-locked chunks,
        and the float64 product back as its chunks drain
        (:mod:`summa.device.casts`): no whole float64 copy of them in host
        memory (out of core on one GPU rank,
        :func:`summa.planning.arrays.with_integers`). None elsewhere:
        integers are converted whole first, the product after.
    scheme_moduli : int or None
        fp64-int8: the moduli every product takes (:attr:`scheme`), as the
        planner read them once: :attr:`moduli` where an in-memory SUMMA
        takes them for every panel, else those asked
        (``SUMMA_FP64_INT8_MODULI``, an entry point's ``moduli``); None:
        each product its K's default (:func:`summa.planning.planner._scheme_moduli`).
    copy_engines : bool or None
        In memory: whether ``auto`` may take direct copies (ipc) between the
        GPUs of a node (:func:`summa.planning.selection.direct_copies_pay`:
        where the peers' blocks stay open or opening them hides behind a
        rank's own GEMMs), decided by the planner on the operands'
        blocks; the in-memory executor makes the broadcasters it names
        (:func:`summa.planning.selection.grid_broadcasters`). True where
        nothing is decided (another kind, CPUs, one rank). None: not yet
        settled, a plan made without the operands
        (:func:`summa.planning.distributed.settled_plan` settles it).
    note : str or None
        Why the mode was chosen for the caller (in memory did not fit; GPU
        operands copied to host memory).
    predicted : dict or None
        The model's time (``make_plan(profile=...)``): ``seconds``,
        ``tflops``, ``profile`` (its path), ``shipped``, and for fp64-int8
        ``native_seconds`` and ``native_tflops``; or ``error``. Not compared.
    """

    shape: tuple
    dtype: str
    backend: str
    ranks: int
    grid: tuple
    trans: tuple
    schedule: str
    out_of_core: bool
    panel_width: object
    lookahead: int
    precision: str | None
    moduli: int | None
    device_budget: int | None
    memory: MemoryPlan
    broadcaster: str = "auto"
    host_copies: str | None = None
    copy_threads: int | None = None
    panel_sums: int | None = None
    placement: Placement = Placement()
    storage: tuple = ("rows", "rows")
    conj: tuple = (False, False)
    host_integers: tuple | None = None
    scheme_moduli: int | None = None
    copy_engines: bool | None = None
    note: str | None = field(default=None, compare=False)
    predicted: dict | None = field(default=None, compare=False)

    def as_dict(self) -> dict:
        """The plan as JSON's values (tuples as lists): equal to what JSON
        gives back, so a recorded plan compares with a printed one."""
        return _plain(asdict(self))

    @property
    def scheme(self) -> ozaki_gpu.Scheme | None:
        """fp64-int8: how its products run (:class:`summa.precision.ozaki_gpu.Scheme`),
        what the executors hand the GEMMs: the moduli (:attr:`scheme_moduli`),
        the rows of A and C each takes at a time and the integer products a
        fold takes (``memory.int8_rows``, ``memory.int8_planes``, the memory
        plan's); None for other precisions."""
        if self.precision != "fp64-int8":
            return None
        return ozaki_gpu.Scheme(moduli=self.scheme_moduli, rows=self.memory.int8_rows,
                                planes=self.memory.int8_planes or ozaki_gpu.PLANES)

    def __str__(self) -> str:
        return "\n".join(plan_lines(self))


def _plain(value):
    """`value` with its tuples made lists, all the way down."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
