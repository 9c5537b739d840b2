"""fp64-int8 as the options ask it: the moduli and the panel sums the
planner decides from ``SUMMA_FP64_INT8_MODULI`` (or an entry point's
``moduli``) and ``SUMMA_FP64_INT8_SUMS``.

:mod:`summa.precision.ozaki_gpu` reads no options: its products take the
moduli of their :class:`summa.precision.ozaki_gpu.Scheme` (None: the
default for their K) and its panel sums are switched by an argument. The
options are read here, once, by the planner, and the Plan hands what it
decided to the executors (:attr:`summa.planning.Plan.scheme`,
``Plan.panel_sums``)."""

from __future__ import annotations

from .. import options
from ..precision import ozaki_gpu, panel_sums

__all__ = ["asked_moduli", "moduli_asked", "moduli_for", "asked_scheme", "panel_sums_apply",
           "panel_sums_bytes"]


def asked_moduli(moduli: int | None):
    """A context inside which the planner takes `moduli` moduli (None: as
    before) for fp64-int8 products, and counts their scratch so: the
    current options (:func:`summa.options.set`) with ``fp64_int8_moduli``
    changed."""
    return options.set(fp64_int8_moduli=moduli)


def moduli_asked(moduli: int | None = None) -> int | None:
    """`moduli`, else the current options' (``SUMMA_FP64_INT8_MODULI``, or
    an entry point's `moduli`), else None (the default for a product's K)."""
    return options.current().fp64_int8_moduli if moduli is None else moduli


def moduli_for(k: int, moduli: int | None = None) -> int:
    """The moduli a product over `k` takes: `moduli`, else
    ``SUMMA_FP64_INT8_MODULI``, else the default for `k`
    (:func:`summa.precision.ozaki_gpu.moduli_for`)."""
    return ozaki_gpu.moduli_for(k, moduli_asked(moduli))


def asked_scheme(precision) -> ozaki_gpu.Scheme | None:
    """fp64-int8: the :class:`summa.precision.ozaki_gpu.Scheme` of the
    moduli asked (:func:`moduli_asked`), what products made outside a
    Plan take (a panel width's measurement); None for other precisions."""
    if precision != "fp64-int8":
        return None
    return ozaki_gpu.Scheme(moduli=moduli_asked())


def panel_sums_apply(dtype, ranks: int, k: int) -> bool:
    """:func:`summa.precision.panel_sums.panel_sums_apply` unless
    ``SUMMA_FP64_INT8_SUMS=0`` (a fold a panel: the reference a benchmark
    compares against)."""
    return panel_sums.panel_sums_apply(dtype, ranks, k,
                                       sums=options.current().fp64_int8_sums != 0)


def panel_sums_bytes(m: int, n: int, width: int, k: int) -> int:
    """:func:`summa.precision.panel_sums.panel_sums_bytes` of the moduli
    asked (:func:`moduli_asked`)."""
    return panel_sums.panel_sums_bytes(m, n, width, k, moduli=moduli_asked())
