"""``python -m summa.precision``: build fp64-int8's shipped kernels
(:func:`summa.precision.binaries.main`). A command of the package, not of
:mod:`summa.precision.binaries` itself: ``import summa`` loads that module
(the plan's report names what it ships), and runpy warns of a module run as
a script after its import."""

import sys

from .binaries import main

sys.exit(main())
