"""Byte counts as a person writes and reads them: ``--device-memory 16GiB``
and ``SUMMA_*`` sizes parsed, and sizes said in messages and plans."""

from __future__ import annotations

import math

__all__ = ["format_bytes", "parse_bytes"]


def format_bytes(nbytes: float) -> str:
    """`nbytes` for a message: in GiB (one decimal) from 1 GiB, else in
    the largest of MiB and KiB it reaches, else in bytes (a budget of a few
    KiB is not "0.0 GiB")."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} byte{'' if int(nbytes) == 1 else 's'}"


def parse_bytes(text: str) -> int:
    """``"16GiB"``, ``"512MiB"``, ``"2e9"`` -> bytes; ValueError otherwise."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    s = str(text).strip().upper().replace(" ", "")
    number = s.rstrip("KMGTIB")
    unit = s[len(number):]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f"expected a size like 16GiB or 512MB, got {text!r}") from None
    if not math.isfinite(value):  # NaN or inf: no number of bytes
        raise ValueError(f"a memory size must be a finite number of bytes, got {text!r}")
    if value <= 0:
        raise ValueError(f"a memory size must be positive, got {text!r}")
    return int(value)
