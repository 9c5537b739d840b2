"""The randomized correctness sweep (tests/sweep.py) on this run's ranks.

``SUMMA_SWEEP_CASES`` (default 150 on 1-2 ranks, 300 / ranks on more) cases per run, shapes up to
``SUMMA_SWEEP_LARGEST`` (default 300 on CPU, 3000 on GPUs); the seed is drawn
fresh (``SUMMA_SWEEP_SEED`` replays one) and printed with every failure. On 4
and 6 ranks a tenth as many cases run again for each of 1 (this machine), 2
and 3 virtual nodes (:meth:`summa.distribution.topology.Topology.virtual`), so that the
paths between nodes run on one machine. Each array case is held to its plan's memory
peak (:mod:`summa.device.account`; ``SUMMA_SWEEP_MEMORY=0`` leaves that out).
"""

import json
import os

import numpy as np
import pytest

from sweep import KNOWN_FAILURES, Grids, draw_case, known_failure, run_case

#: Each test's subject is the process grid's shape: ./run test runs them on every
#: rank count (the others on a few: pyproject.toml's markers).
pytestmark = pytest.mark.grid


def checked(case: dict, grids: Grids, backend, replay: str = "") -> float:
    """:func:`sweep.run_case`, its exception (raised alike on every rank:
    summa refuses collectively) naming the case as run_case takes it back
    and `replay`, how to draw it again."""
    try:
        return run_case(case, grids, backend)
    except Exception as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc} -- on the case {case}"
                             + (f" ({replay})" if replay else "")) from exc


def default_cases(size: int) -> int:
    """150 cases on 1 and 2 ranks, fewer on more (100 on 3, 50 on 6): each
    rank of a case costs about the same CPU time, and a 2-core CI machine
    ran 6 ranks' 150 for 49 s. Every run draws fresh cases."""
    return min(150, 300 // size)


def _settings(comm, backend) -> tuple[int, int, int]:
    """Cases, the largest dimension and the seed (the same on every rank)."""
    cases = int(os.environ.get("SUMMA_SWEEP_CASES", default_cases(comm.Get_size())))
    largest = int(os.environ.get("SUMMA_SWEEP_LARGEST",
                                 "3000" if backend.name == "cupy" else "300"))
    seed = os.environ.get("SUMMA_SWEEP_SEED")
    seed = comm.bcast(int(seed) if seed else int(np.random.SeedSequence().entropy % 2**32))
    return cases, largest, seed


def _run_cases(grids: Grids, backend, seed: int, cases) -> tuple[list, int]:
    """Run the drawn `cases` (in the order drawn, case i drawn from `seed`),
    leaving out the known failures (tested by test_known_failures_still_fail):
    ``(wrong, known)``, the ``(error, case)`` of each wrong product (rank 0)
    and how many were left out."""
    wrong, known = [], 0
    for i, case in enumerate(cases):
        if known_failure(case, backend):
            known += 1
            continue
        error = checked(case, grids, backend, f"SUMMA_SWEEP_SEED={seed}, case {i}")
        if grids.comm.rank == 0 and not error <= 1:
            wrong.append((error, case))
    return wrong, known


@pytest.mark.mpi(min_size=1)
def test_randomized_sweep_has_no_wrong_product(comm, backend):
    from test_comm import modes
    cases, largest, seed = _settings(comm, backend)
    rng = np.random.default_rng(seed)
    available = modes(backend)
    grids = Grids(comm)
    try:
        wrong, known = _run_cases(grids, backend, seed, (
            draw_case(rng, comm.Get_size(), backend, available, largest, seed + i)
            for i in range(cases)))
    finally:
        grids.free()
    if comm.rank == 0:
        record = os.environ.get("SUMMA_SWEEP_RECORD")
        if record:  # one line per run, for docs/benchmarks.md
            with open(record, "a") as fh:
                fh.write(json.dumps({"ranks": comm.Get_size(), "backend": backend.name,
                                     "cases": cases, "wrong": len(wrong), "seed": seed,
                                     "largest": largest, "known_failures_left_out": known})
                         + "\n")
        assert not wrong, (f"{len(wrong)} of {cases} products wrong (SUMMA_SWEEP_SEED={seed}); "
                           + "; ".join(f"{e:.3g}: {c}" for e, c in wrong[:5]))


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_randomized_sweep_on_virtual_nodes_has_no_wrong_product(comm, backend, nodes):
    """Cases alternately through DistMatrix operands and the array entry point
    on ranks split into `nodes` virtual nodes: node-shared arrays, in-place
    reads of the root's arrays and CUDA IPC within each, MPI between them.
    One node (MPI's own topology) runs the array entry point alone: the main
    sweep runs the rest."""
    from summa.distribution.topology import Topology
    from test_comm import modes
    if comm.Get_size() not in (4, 6):
        pytest.skip("virtual nodes are swept on 4 and 6 ranks")
    cases, largest, seed = _settings(comm, backend)
    cases = max(2, cases // 10)
    rng = np.random.default_rng(seed)
    available = [m for m in modes(backend) if nodes == 1 or m != "ipc"]
    topology = Topology.virtual(comm, nodes) if nodes > 1 else None
    grids = Grids(comm, topology)
    try:
        wrong, _ = _run_cases(grids, backend, seed, (
            draw_case(rng, comm.Get_size(), backend, available, largest, seed + i,
                      entry="arrays" if i % 2 or nodes == 1 else "dist")
            for i in range(cases)))
    finally:
        grids.free()
        if topology is not None:
            topology.free()
    if comm.rank == 0:
        assert not wrong, (f"{len(wrong)} of {cases} products wrong on {nodes} virtual node(s) "
                           f"(SUMMA_SWEEP_SEED={seed}); " + "; ".join(
                               f"{e:.3g}: {c}" for e, c in wrong[:5]))


@pytest.mark.parametrize("name, has, case, today", [
    pytest.param(*known, marks=pytest.mark.xfail(strict=True, raises=ValueError,
                                                 reason=f"{known[0]}: {known[3]}"),
                 id=known[0].replace(" ", "-")) for known in KNOWN_FAILURES])
def test_known_failures_still_fail(comm, backend, name, has, case, today):
    """Each valid case the sweep leaves out (sweep.KNOWN_FAILURES) still
    fails, and with today's error: strict, so the fix that makes it pass
    fails here until its entry is removed (and the sweep draws it again)."""
    assert has(case, backend), f"{name}: its example lacks its property"
    grids = Grids(comm)
    try:
        error = run_case(case, grids, backend)
    except ValueError as exc:
        assert f"ValueError: {exc}" == today, "it fails otherwise than recorded"
        raise
    finally:
        grids.free()
    assert error <= 1
