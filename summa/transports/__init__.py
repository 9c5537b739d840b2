"""How panels travel between ranks.

The panel broadcasters (NCCL, CUDA-aware MPI, host-staged MPI) and chunked
transfers (:mod:`summa.transports.comm`), the broadcasters by name, made and
self-tested, and copy-engine panels between the GPUs of one node read
straight from the owners' blocks (:mod:`summa.transports.ipc`).
"""
