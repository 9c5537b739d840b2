"""The executors that run a Plan and decide nothing again.

In-memory SUMMA (:mod:`summa.execution.algorithm`, each rank's steps in
:mod:`summa.execution.steps`, walking a schedule with
:mod:`summa.execution.pipeline`), column strips on grids of one column, the
out-of-core sweep over host-resident tiles, A's panels copied transposed
before their GEMMs, and the products of arrays held on one rank
(:mod:`summa.execution.arrays`: one GEMM where they lie, or over a grid
from host memory), which ``summa.matmul``, :class:`summa.Matmul` and the
pool's workers share; the entry points' side of a job's progress line
(:mod:`summa.execution.jobprogress`).
"""
