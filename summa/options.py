"""Every setting of summa, once: keyword arguments over ``SUMMA_*`` variables
over defaults.

:class:`Options` is one frozen value holding every setting; each field
names its environment variable, its allowed values, its default and a
one-line description, so the fields are the registry (:func:`table` prints
them as the documentation's table, docs/options.md). It is validated when
made: a bad value is one ValueError naming the variable and the value.

Entry points (``summa.matmul``, ``summa.gemm``, ``multiply_files``, the
command line, the pool's workers) take an ``options`` keyword or read the
environment once (:func:`entry_point`), and hand the one value down: to the
backend (:attr:`summa.device.backend.Backend.options`: its GEMM library), and to
the rest of the call as this process's current options (:func:`set`, read
by :func:`current`), so nothing below them reads the environment. Pool
workers get it as one JSON value (:meth:`Options.to_json`). A library
function called on its own, outside any entry point, reads the
environment's current settings through :func:`current` (parsed again only
where a variable changed). The scopes and that last parse are this
module's only process-wide state.

This module is the only one of summa that reads ``SUMMA_*`` variables, and
summa writes none: settings travel as arguments and as this value.

Examples
--------
>>> from summa import options
>>> opts = options.Options.from_env(copy_threads=4)   # keyword > SUMMA_COPY_THREADS > default
>>> with options.set(opts):                            # what the library's calls see
...     options.current().copy_threads
4
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field

from .precision import ozaki

__all__ = ["Options", "current", "set", "entry_point", "defaults", "table", "document",
           "blas_threads_set"]

#: The GPU GEMM libraries ``SUMMA_GEMM`` names (:func:`summa.device.backend.gemm_library`).
GEMM_LIBRARIES = ("cublas", "cublaslt")
#: ``SUMMA_INT8_GEMM``'s values (:func:`summa.device.backend.int8_library`).
INT8_LIBRARIES = ("auto", "gemmex", "cublaslt", "cublaslt:I")
#: ``SUMMA_TRANSPOSE_A``'s and ``SUMMA_TRANSPOSE_B``'s values
#: (:func:`summa.planning.tuning.transposes_a`, :func:`~summa.planning.tuning.transposes_b`).
TRANSPOSE_A_SETTINGS = ("auto", "yes", "no")
#: ``SUMMA_COMPUTE_PRIORITY``'s values.
PRIORITIES = ("default", "high")
#: ``SUMMA_HOST_COPIES``'s values (:func:`summa.planning.make_plan`'s `host_copies`).
HOST_COPIES = ("stage", "lock")


class _Kind:
    """How one setting's text becomes its value, and which values it takes.

    Subclasses implement :meth:`parse` (text, never empty, to a value) and
    may refine :meth:`check` (a value given as a keyword)."""

    values = "text"

    def parse(self, variable: str, text: str):
        return text

    def check(self, variable: str, value):
        if not isinstance(value, str):
            raise ValueError(f"{variable} must be {self.values}, got {value!r}")
        return self.parse(variable, value.strip())


class _Text(_Kind):
    """Any text (a path, a command line)."""

    def check(self, variable, value):
        if not isinstance(value, str):
            raise ValueError(f"{variable} must be text, got {value!r}")
        return value.strip()


class _Choice(_Kind):
    """One of a few names, any case."""

    def __init__(self, *choices: str):
        self.choices = choices
        self.values = ", ".join(choices)

    def parse(self, variable, text):
        name = text.lower()
        if name not in self.choices:
            raise ValueError(f"{variable}={name!r} is not one of {self.values}")
        return name

    def check(self, variable, value):
        return self.parse(variable, str(value).strip())


class _Int8Library(_Kind):
    """A library for INT8 GEMMs, with cuBLASLt's algorithm perhaps."""

    values = ", ".join(INT8_LIBRARIES) + " (I a number)"

    def parse(self, variable, text):
        asked = text.lower()
        name, colon, index = asked.partition(":")
        if not (name in ("auto", "gemmex") and not colon or name == "cublaslt"
                and (not colon or index.isdigit())):
            raise ValueError(f"{variable} must be one of {', '.join(INT8_LIBRARIES)} "
                             f"(I a number), got {asked!r}")
        return asked


class _File(_Kind):
    """The path of a file that exists."""

    values = "a file's path"

    def parse(self, variable, text):
        if not os.path.isfile(text):
            raise ValueError(f"{variable}={text!r} is not a file")
        return text


class _Number(_Kind):
    """An int or a float, finite, at least `least`."""

    def __init__(self, kind: type, least):
        self.kind, self.least = kind, least
        self.values = f"{'an integer' if kind is int else 'a number'} >= {least}"

    def parse(self, variable, text):
        try:
            value = self.kind(text)
        except ValueError:
            what = "an integer" if self.kind is int else "a number"
            raise ValueError(f"{variable} must be {what}, got {text!r}") from None
        return self.check(variable, value, text)

    def check(self, variable, value, text=None):
        if isinstance(value, str):
            return self.parse(variable, value.strip())
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                self.kind is int and not float(value).is_integer():
            raise ValueError(f"{variable} must be {self.values}, got {value!r}")
        if not (math.isfinite(value) and value >= self.least):
            shown = text if text is not None else value
            raise ValueError(f"{variable} must be a finite number >= {self.least}, "
                             f"got {shown!r}")
        return self.kind(value)


class _Switch(_Kind):
    """0 or 1 (False or True)."""

    values = "0 or 1"

    def parse(self, variable, text):
        if text not in ("0", "1"):
            raise ValueError(f"{variable} must be 0 or 1, got {text!r}")
        return text == "1"

    def check(self, variable, value):
        if isinstance(value, str):
            return self.parse(variable, value.strip())
        if value not in (0, 1):
            raise ValueError(f"{variable} must be 0 or 1, got {value!r}")
        return bool(value)


class _Tiles(_Kind):
    """``RxC``: R x C tiles (whether they cut C, the plan says)."""

    values = "RxC (e.g. 3x2)"

    def parse(self, variable, text):
        try:
            rows, cols = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"{variable}: expected RxC (e.g. 3x2), got {text!r}") from None
        return self.check(variable, (rows, cols))

    def check(self, variable, value):
        if isinstance(value, str):
            return self.parse(variable, value.strip())
        try:
            rows, cols = (int(x) for x in value)
        except (TypeError, ValueError):
            raise ValueError(f"{variable}: expected RxC (e.g. 3x2), got {value!r}") from None
        return rows, cols


class _Moduli(_Kind):
    """How many moduli fp64-int8 products take."""

    @property
    def values(self):
        return "{}-{}".format(*ozaki.moduli_range())

    def parse(self, variable, text):
        if not text.lstrip("+-").isdigit():
            raise ValueError(f"{variable}={text!r}: moduli must be an integer")
        try:
            return ozaki.check_moduli(int(text))
        except ValueError as exc:  # out of range
            raise ValueError(f"{variable}={text!r}: {exc}") from None

    def check(self, variable, value):
        if isinstance(value, str):
            return self.parse(variable, value.strip())
        try:
            return ozaki.check_moduli(value)
        except ValueError as exc:
            raise ValueError(f"{variable}={value!r}: {exc}") from None


class _Timeout(_Number):
    """Seconds; 0: none."""

    def __init__(self):
        super().__init__(float, 0.0)
        self.values = "seconds >= 0 (0: none)"

    def parse(self, variable, text):
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{variable} must be a number of seconds, got {text!r}") from None
        if not value >= 0:
            raise ValueError(f"{variable} must be >= 0, got {text!r}")
        return value


class _Workers(_Number):
    """A pool's size: at least one."""

    def __init__(self):
        super().__init__(int, 1)

    def check(self, variable, value, text=None):
        if not isinstance(value, str) and not isinstance(value, bool) and \
                isinstance(value, int) and value < 1:
            raise ValueError(f"a pool needs at least one worker, not {value}")
        return super().check(variable, value, text)


def _setting(variable: str, kind: _Kind, default, doc: str, internal: bool = False):
    """One field of :class:`Options`: its variable, kind, default and doc."""
    return field(default=default, metadata={"variable": variable, "kind": kind, "doc": doc,
                                            "internal": internal})


@dataclass(frozen=True)
class Options:
    """Every setting of summa (see the module; :func:`table` lists them).

    Make one with :meth:`from_env` (keyword arguments over ``SUMMA_*``
    variables over defaults) or ``Options(**fields)`` (defaults under the
    fields given); every field is checked when it is made. Fields left None
    are chosen at run time (by the machine, the problem's shape).
    """

    gemm: str = _setting("SUMMA_GEMM", _Choice(*GEMM_LIBRARIES), "cublas",
                         "GPU GEMM library: cuBLAS gemmEx, or cuBLASLt with the fastest of "
                         "several algorithms timed per shape.")
    cublaslt: str | None = _setting("SUMMA_CUBLASLT", _File(), None,
                                    "The libcublasLt file to load (another CUDA release's, to "
                                    "compare kernels); default: CuPy's.")
    int8_gemm: str = _setting("SUMMA_INT8_GEMM", _Int8Library(), "auto",
                              "INT8 GEMMs of fp64-int8: auto (cuBLASLt's measured choice for "
                              "large products, its candidates tried on the products "
                              "themselves), gemmex, cublaslt, or cublaslt:I (its heuristic's "
                              "I-th algorithm).")
    compute_priority: str = _setting("SUMMA_COMPUTE_PRIORITY", _Choice(*PRIORITIES), "default",
                                     "high: the SUMMA loop's GEMMs on a stream of the highest "
                                     "priority (experimental).")
    transpose_a: str = _setting("SUMMA_TRANSPOSE_A", _Choice(*TRANSPOSE_A_SETTINGS), "auto",
                                "Whether panel GEMMs read A from a transposed copy of each "
                                "panel (auto: where measured faster).")
    transpose_b: str = _setting("SUMMA_TRANSPOSE_B", _Choice(*TRANSPOSE_A_SETTINGS), "auto",
                                "Whether panel GEMMs read B's panels that lie by columns from "
                                "a row-major copy of each (auto: where measured faster).")
    fp64_int8_moduli: int | None = _setting("SUMMA_FP64_INT8_MODULI", _Moduli(), None,
                                            "Moduli of fp64-int8 products (fewer: faster, less "
                                            "accurate); default: by K.")
    fp64_int8_sums: int = _setting("SUMMA_FP64_INT8_SUMS", _Number(int, 0), 1,
                                   "0: fp64-int8 on a grid folds C once a panel instead of "
                                   "summing INT8 products over K (a reference to compare).")
    host_copies: str = _setting("SUMMA_HOST_COPIES", _Choice(*HOST_COPIES), "stage",
                                "Out of core: copy host tiles through page-locked chunks "
                                "(stage) or lock the arrays' pages (lock).")
    ooc_tiles: tuple | None = _setting("SUMMA_OOC_TILES", _Tiles(), None,
                                       "Out of core: R x C tiles of C per rank instead of the "
                                       "planner's fewest; a cut whose two C tiles (one "
                                       "multiplied, one going home) do not fit the budget runs "
                                       "with one, each tile waiting for the last one's "
                                       "write-back (summa plan says so).")
    upload_lead: int = _setting("SUMMA_UPLOAD_LEAD", _Number(int, 0), 1,
                                "Out of core: extra slots uploads may run ahead of their GEMMs.")
    copy_threads: int | None = _setting("SUMMA_COPY_THREADS", _Number(int, 1), None,
                                        "Host copy threads per rank; default: by the cores "
                                        "the node's ranks share.")
    io_threads: int | None = _setting("SUMMA_IO_THREADS", _Number(int, 1), None,
                                      "Threads a rank reads and writes files with; default: "
                                      "by its cores, at most 16.")
    cuda_aware: bool | None = _setting("SUMMA_CUDA_AWARE", _Switch(), None,
                                       "Does MPI take GPU buffers? Default: asked of the MPI "
                                       "library.")
    peer_access: bool | None = _setting("SUMMA_PEER_ACCESS", _Switch(), None,
                                        "Can the GPUs of a grid row and column read each "
                                        "other's memory? Default: asked of CUDA.")
    memory_check: bool = _setting("SUMMA_MEMORY_CHECK", _Switch(), False,
                                  "Raise where a run draws more device memory than its plan's "
                                  "peak (summa's miscount; the test suites set it).")
    in_place: bool = _setting("SUMMA_IN_PLACE", _Switch(), True,
                              "0: pool workers get copies in shared memory instead of reading "
                              "the caller's arrays in place.")
    shm_dir: str = _setting("SUMMA_SHM_DIR", _Text(), "/dev/shm",
                            "Where node-shared arrays live.")
    cache_dir: str | None = _setting("SUMMA_CACHE_DIR", _Text(), None,
                                     "Where measured choices persist; default: ~/.cache/summa.")
    timeout: float | None = _setting("SUMMA_TIMEOUT", _Timeout(), None,
                                     "Seconds a step may wait on other ranks before the job "
                                     "is aborted (0: no watchdog); default: the command's.")
    error_grace: float = _setting("SUMMA_ERROR_GRACE", _Number(float, 0.0), 10.0,
                                  "Seconds ranks wait to agree on an error before aborting.")
    pool_start: float = _setting("SUMMA_POOL_START", _Number(float, 0.0), 120.0,
                                 "Seconds a pool's workers may take to start.")
    gpus: int | None = _setting("SUMMA_GPUS", _Workers(), None,
                                "Pool of a plain Python process: workers on GPUs; default: "
                                "every visible GPU.")
    workers: int | None = _setting("SUMMA_WORKERS", _Workers(), None,
                                   "Pool without GPUs: CPU workers; default: one per 8 cores.")
    mpiexec: str | None = _setting("MPIEXEC", _Text(), None,
                                   "The launcher pools start workers with; default: the "
                                   "mpiexec beside Python, else on PATH.")
    progress: str = _setting("SUMMA_PROGRESS", _Choice("auto", "bar", "lines", "off"), "auto",
                             "The job's progress line on rank 0's stderr (a pool's: its "
                             "caller's): auto (a line redrawn in place on a terminal, else a "
                             "plain line each SUMMA_PROGRESS_INTERVAL seconds once a phase has "
                             "run a second), bar, lines or off.")
    progress_interval: float = _setting("SUMMA_PROGRESS_INTERVAL", _Number(float, 0.01), 60.0,
                                        "Seconds between the plain progress lines written "
                                        "where stderr is not a terminal (batch logs).")
    progress_after: float = _setting("SUMMA_PROGRESS_AFTER", _Number(float, 0.0), 2.0,
                                     "Seconds a phase of summa.matmul or summa.Matmul on the "
                                     "caller's own ranks (mpiexec's, or this process; not a "
                                     "pool) runs before rank 0 shows its progress line: shorter "
                                     "products print nothing (the commands and a pool's caller "
                                     "show theirs from the start).")
    inject_fault: str | None = _setting("SUMMA_INJECT_FAULT", _Text(), None,
                                        "Tests: PHASE:RANK:ACTION[,...] faults to inject.",
                                        internal=True)
    pool_key: str | None = _setting("SUMMA_POOL_KEY", _Text(), None,
                                    "Pool protocol: the key a worker connects with.",
                                    internal=True)
    pool_warm: str = _setting("SUMMA_POOL_WARM", _Text(), "auto",
                              "Pool protocol: the backend a worker readies while it waits.",
                              internal=True)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            if isinstance(value, str) and not value.strip():
                checked = f.default  # empty is unset
            else:
                checked = f.metadata["kind"].check(f.metadata["variable"], value)
            object.__setattr__(self, f.name, checked)

    @classmethod
    def from_env(cls, environ=None, **overrides) -> "Options":
        """Keyword `overrides` (None: not given) over the ``SUMMA_*``
        variables of `environ` (default ``os.environ``, read once here) over
        the defaults; one ValueError naming the variable where a value is bad."""
        environ = os.environ if environ is None else environ
        unknown = builtins.set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}")
        given = {}
        for f in dataclasses.fields(cls):
            if overrides.get(f.name) is not None:
                given[f.name] = overrides[f.name]
                continue
            text = environ.get(f.metadata["variable"], "")
            if text.strip():
                given[f.name] = text
        return cls(**given)

    def replace(self, **fields) -> "Options":
        """A copy with `fields` changed (None leaves a field as it is), checked."""
        return dataclasses.replace(self, **{k: v for k, v in fields.items() if v is not None})

    def to_json(self) -> str:
        """These options as one JSON value (:meth:`from_json` makes them again)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Options":
        """The options :meth:`to_json` wrote."""
        return cls(**json.loads(text))

    def variables(self, internal: bool = False) -> dict:
        """The variables of the settings not at their defaults, and their
        values as text (the internal ones too where `internal`)."""
        return {f.metadata["variable"]: _text(getattr(self, f.name))
                for f in dataclasses.fields(self) if getattr(self, f.name) != f.default
                and (internal or not f.metadata["internal"])}


#: Every setting's variable, in the order of the fields.
_VARIABLES = tuple(f.metadata["variable"] for f in dataclasses.fields(Options))


def _text(value) -> str:
    """A value as its variable would be written."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


#: Options made current by :func:`set`, innermost last. With
#: :data:`_parsed` the only process-wide state of this module.
_scopes: list = []
#: The environment's settings as last read: ``(their variables' texts, Options)``.
_parsed: tuple = ((), None)


def current() -> Options:
    """The options library calls run with: the innermost :func:`set`'s
    (an entry point's, for the whole of its call), else the environment's
    as it is now (a library function called on its own; parsed again only
    where a variable changed)."""
    if _scopes:
        return _scopes[-1]
    global _parsed
    texts = tuple(map(os.environ.get, _VARIABLES))
    if _parsed[0] != texts:
        _parsed = (texts, Options.from_env())
    return _parsed[1]


@contextlib.contextmanager
def set(options: Options | None = None, **fields):  # noqa: A001 -- dask's name for it
    """Within, :func:`current` is `options` (default: the current ones)
    with `fields` changed.

    Examples
    --------
    >>> with set(copy_threads=2):
    ...     current().copy_threads
    2
    """
    chosen = current() if options is None else options
    _scopes.append(chosen.replace(**fields) if fields else chosen)
    try:
        yield _scopes[-1]
    finally:
        _scopes.pop()


def entry_point(function):
    """Make `function` an entry point: it takes an ``options`` keyword (an
    :class:`Options`; default: the current ones, read from the environment
    here once for the call) and runs with it as the current options, so
    that what it calls sees the same settings."""
    @functools.wraps(function)
    def call(*args, options: Options | None = None, **kwargs):
        with set(options):
            return function(*args, **kwargs)
    return call


def defaults(internal: bool = False) -> dict:
    """Every setting's variable and its default as text (None: chosen at
    run time), the internal ones too where `internal`."""
    return {f.metadata["variable"]: None if f.default is None else _text(f.default)
            for f in dataclasses.fields(Options) if internal or not f.metadata["internal"]}


def table(internal: bool = False) -> str:
    """Every setting as a Markdown table: its variable, field, values,
    default and description (the internal ones too where `internal`)."""
    lines = ["| Variable | Keyword | Values | Default | What it sets |",
             "|---|---|---|---|---|"]
    for f in dataclasses.fields(Options):
        meta = f.metadata
        if meta["internal"] and not internal:
            continue
        default = "(chosen)" if f.default is None else f"`{_text(f.default)}`"
        doc = f"(internal) {meta['doc']}" if meta["internal"] else meta["doc"]
        lines.append(f"| `{meta['variable']}` | `{f.name}` | {meta['kind'].values} | "
                     f"{default} | {doc} |")
    return "\n".join(lines) + "\n"


_DOCUMENT = """# Settings

Every setting summa reads, with its default. The defaults are chosen for you (most by
measuring your machine or the product): you need none of these to run summa. They are
there to fit summa to a machine or a job: how many workers a plain Python process starts
(`SUMMA_GPUS`, `SUMMA_WORKERS`), which MPI launcher starts them (`MPIEXEC`), how many host
threads copy and read files (`SUMMA_COPY_THREADS`, `SUMMA_IO_THREADS`), where shared memory
and measured choices live (`SUMMA_SHM_DIR`, `SUMMA_CACHE_DIR`), how long a rank may wait on
the others (`SUMMA_TIMEOUT`). The rest override a choice summa makes by measurement (how
the GEMMs read their operands, how C is cut out of core, fp64-int8's moduli), to compare
with it on your machine.
`python -m summa options` prints the settings in effect, those at their defaults marked.

Set one as an environment variable, for a whole job:

    SUMMA_COPY_THREADS=8 mpiexec -n 8 python -m summa multiply A.npy B.npy -o C.npy

or, in Python, for one call (a call's keyword wins over the variable):

    from summa.options import Options
    c = summa.matmul(a, b, options=Options.from_env(copy_threads=8))

Every value is checked where a call or a command begins; a bad one is an error naming the
variable. `python -m summa options` prints the settings that are not at their defaults, as summa
reads them here. Those marked (internal) serve summa's own tests and its pool's workers: leave
them unset.

"""


def document() -> str:
    """docs/options.md: what the settings are, and :func:`table` of all of them."""
    return _DOCUMENT + table(internal=True)


#: The variables that size a BLAS's thread pool (the user's, not summa's).
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def blas_threads_set(environ=None) -> bool:
    """Did the user size the BLAS's threads (:data:`BLAS_THREAD_VARIABLES`
    of `environ`, default ``os.environ``)? Then summa leaves them alone."""
    environ = os.environ if environ is None else environ
    return any(environ.get(v) for v in BLAS_THREAD_VARIABLES)
