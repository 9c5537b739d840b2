"""The randomized correctness sweep (tests/sweep.py) on this run's ranks.

``SUMMA_SWEEP_CASES`` (default 150) cases per run, shapes up to
``SUMMA_SWEEP_LARGEST`` (default 300 on CPU, 3000 on GPUs); the seed is drawn
fresh (``SUMMA_SWEEP_SEED`` replays one) and printed with every failure.
"""

import json
import os

import numpy as np
import pytest

from sweep import Grids, draw_case, run_case


@pytest.mark.mpi(min_size=1)
def test_randomized_sweep_has_no_wrong_product(comm, backend):
    from test_comm import modes
    cases = int(os.environ.get("SUMMA_SWEEP_CASES", "150"))
    largest = int(os.environ.get("SUMMA_SWEEP_LARGEST",
                                 "3000" if backend.name == "cupy" else "300"))
    seed = os.environ.get("SUMMA_SWEEP_SEED")
    seed = comm.bcast(int(seed) if seed else int(np.random.SeedSequence().entropy % 2**32))
    rng = np.random.default_rng(seed)
    available = modes(backend)
    grids = Grids(comm)
    wrong = []
    try:
        for i in range(cases):
            case = draw_case(rng, comm.Get_size(), backend, available, largest)
            error = run_case(case, grids, backend, seed=seed + i)
            if comm.rank == 0 and not error <= 1:
                wrong.append((error, case))
    finally:
        grids.free()
    if comm.rank == 0:
        record = os.environ.get("SUMMA_SWEEP_RECORD")
        if record:  # one line per run, for docs/benchmarks.md
            with open(record, "a") as fh:
                fh.write(json.dumps({"ranks": comm.Get_size(), "backend": backend.name,
                                     "cases": cases, "wrong": len(wrong), "seed": seed,
                                     "largest": largest}) + "\n")
        assert not wrong, (f"{len(wrong)} of {cases} products wrong (SUMMA_SWEEP_SEED={seed}); "
                           + "; ".join(f"{e:.3g}: {c}" for e, c in wrong[:5]))
