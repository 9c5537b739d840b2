"""float64 products from exact int8 products (Ozaki scheme II).

The scheme for NumPy or CuPy (:mod:`summa.precision.ozaki`) and the same
fused into CuPy kernels with the residue products on the INT8 tensor cores
(:mod:`summa.precision.ozaki_gpu`; ``precision="fp64-int8"``).
"""
