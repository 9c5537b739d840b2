"""summa's numeric ``SUMMA_*`` environment settings, each read one way and
checked with one clear error (a bad value otherwise surfaced as a raw
``int()``/``float()`` error deep inside a run, or at import).
:func:`summa.backend.get_backend`, which every entry point passes before any
work, checks them all (:func:`check_numbers`)."""

from __future__ import annotations

import math
import os

__all__ = ["NUMBERS", "number", "check_numbers"]

#: Each setting's type and its smallest value.
NUMBERS = {
    "SUMMA_ERROR_GRACE": (float, 0.0),   # seconds ranks wait to agree on an error
    "SUMMA_POOL_START": (float, 0.0),    # seconds the pool's workers may take to start
    "SUMMA_UPLOAD_LEAD": (int, 0),       # extra out-of-core slots uploads may run ahead
    "SUMMA_IO_THREADS": (int, 1),        # threads a rank reads and writes files with
    "SUMMA_COPY_THREADS": (int, 1),      # host copy threads per rank
    "SUMMA_FP64_INT8_SUMS": (int, 0),    # 0: fp64-int8 on a grid folds C once a panel
}


def number(name: str, default):
    """The setting `name` of :data:`NUMBERS`: `default` where unset or
    empty, else its value, one clear ValueError naming it where it is not a
    number of its type at least its smallest."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    kind, least = NUMBERS[name]
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name} must be {what}, got {text!r}") from None
    if not (math.isfinite(value) and value >= least):
        raise ValueError(f"{name} must be a finite number >= {least}, got {text!r}")
    return value


def check_numbers() -> None:
    """Check every setting of :data:`NUMBERS` that is set."""
    for name in NUMBERS:
        number(name, None)
