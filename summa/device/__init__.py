"""The NumPy/CuPy seam and what runs on a device.

The backends (:mod:`summa.device.backend`: in-place GEMM, staging buffers,
events, the capabilities callers ask), what a backend's name says for plans of
another machine (:mod:`summa.device.traits`), cuBLASLt GEMMs with a timed
choice of algorithm, and host-GPU copies through page-locked chunks
(:mod:`summa.device.staging`).
"""
