"""What a product with NaN/Inf values warns of, in the same words wherever it
was made: which input holds how many NaN/Inf values, or that the product
overflowed (:func:`summa.api.multiply.matmul` of arrays and
:func:`summa.api.files.multiply_files` both say them)."""

from __future__ import annotations

import numpy as np

__all__ = ["nonfinite_notes", "nonfinite_note", "overflow_note"]


def nonfinite_notes(operands: dict, dtype) -> list[str]:
    """What a product with NaN/Inf values warns of: how many each of the
    named `operands` holds (a pass over them, made only then), or that the
    product overflowed."""
    counts = {name: int((~np.isfinite(x)).sum()) for name, x in operands.items()}
    notes = [nonfinite_note(name, bad) for name, bad in counts.items() if bad]
    return notes or [overflow_note(dtype, f"{' and '.join(operands)} are")]


def nonfinite_note(name: str, count: int) -> str:
    """The warning of `count` NaN/Inf values in the input `name`."""
    return f"{name} contains {count} NaN/Inf value(s); the product will contain NaN/Inf too"


def overflow_note(dtype, finite: str) -> str:
    """The warning of a product with NaN/Inf values though its inputs
    (`finite`: "the inputs are") are finite."""
    return (f"the product has NaN/Inf values (or values near the end of the "
            f"{np.dtype(dtype).name} range) though {finite} finite: it overflowed")
