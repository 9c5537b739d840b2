"""What runs around a job: watchdog, cleanup, faults, agreement, progress.

The step watchdog and signal handling, the removal of unfinished outputs and
MPI's shared memory however a process ends, fault injection for tests, the
collective agreement on errors of steps that can fail on some ranks, and the
progress bar on rank 0. Every other package may use these; they use no
other package of summa, only the settings (:mod:`summa.options`).
"""
