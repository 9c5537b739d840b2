"""The executors that run a Plan and decide nothing again.

In-memory SUMMA (:mod:`summa.execution.algorithm`, walking a schedule with
:mod:`summa.execution.pipeline`), column strips on grids of one column, the
out-of-core sweep over host-resident tiles, and A's panels copied
transposed before their GEMMs.
"""
