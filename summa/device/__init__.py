"""The NumPy/CuPy seam and what runs on a device.

The backends (:mod:`summa.device.backend` chooses one;
:mod:`summa.device.base` is their interface: in-place GEMM, staging buffers,
events, the capabilities callers ask; :mod:`summa.device.numpy_backend` and
:mod:`summa.device.cupy_backend` the two), what a backend's name says for plans of
another machine (:mod:`summa.device.traits`), cuBLASLt GEMMs with a timed
choice of algorithm, and host-GPU copies through page-locked chunks
(:mod:`summa.device.staging`).
"""
