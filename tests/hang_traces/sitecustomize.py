"""Imported at the start of every Python process a test launches with this
folder on its PYTHONPATH (:func:`test_cli.job`): SIGUSR2 then dumps every
thread's Python stack to stderr, even from inside a blocking C call, so that
a job that outlives its test's timeout says where each rank waits. Nothing
else changes: summa handles no SIGUSR2."""

import faulthandler
import signal

faulthandler.register(signal.SIGUSR2, all_threads=True)
