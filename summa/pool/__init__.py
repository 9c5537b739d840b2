"""Every GPU from one plain Python process: a pool of MPI workers it starts.

``summa.matmul(a, b)`` in a script or notebook that no MPI launcher started
(a world of one rank) runs on every visible GPU: the process starts the
workers as an ordinary MPI job of the MPI mpi4py was built with (its
``mpiexec``, or ``MPIEXEC``; :mod:`summa.pool.worker`), one rank per GPU, keeps it
between calls and stops it at exit. The arrays reach the workers through
shared memory (:func:`summa.host.shared.named`: copied once on host threads, not at
all where they were made with :func:`summa.host.empty` without a
communicator), and the product comes back as one too.

A :class:`summa.Matmul` made in such a process lives in the workers
(:class:`PooledMatmul`): they plan it once and keep its process grid, with
what that holds, between its executions, until it is freed.

The calling process is no rank and needs no MPI: it sends each command over
a local socket and then only waits, so it can never be caught in a
collective that a dead worker will not join. (``MPI.COMM_SELF.Spawn`` was
tried first: with MPICH a worker that fails takes the spawning process down
with it.) A worker that raises or dies ends the call with one exception
naming the rank and the cause (a worker that died, where one did, rather
than the MPI error its death left the others); the job is then ended and the next call
starts a new pool; SUMMA_TIMEOUT seconds without an answer does the same.
Ctrl-C raises KeyboardInterrupt once the job is ended (a second or so; a few
while the workers start, which take it once they can clean up). The
workers wait for a call asleep, each on its socket (no CPU while idle), and
end by themselves, removing what their owner left in shared memory, when the
owner is killed. Under a launcher (a world of several ranks) nothing is
started.

The pool's processes are :mod:`summa.pool.launch` (the job, its connections,
how it ends), the calls made on it :mod:`summa.pool.calls` (what they ship
and how they wait), the workers' side :mod:`summa.pool.worker`; how a job
summa launches is started and stopped, leaving nothing in /dev/shm,
:mod:`summa.pool.job`.
"""

from .launch import WorkerError, close, launched, mpiexec_command, pool_size, start
from .calls import PooledMatmul, dtype_checker, matmul

__all__ = ["WorkerError", "pool_size", "launched", "matmul", "PooledMatmul", "start", "close",
           "mpiexec_command", "dtype_checker"]
