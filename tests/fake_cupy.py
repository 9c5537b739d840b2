"""Just enough of CuPy for summa.device.staging on a machine without a GPU.

"Device" arrays are NumPy arrays behind a ``.data.ptr``; a copy runs at once
(ctypes.memmove row by row) when it is queued, so streams and events are
already complete. What this checks is the stager's own work: chunking, the
threads, the rings, strides, errors; the GPU's ordering is checked on the GPU.
"""

from __future__ import annotations

import ctypes
import threading
import types

import numpy as np


class DeviceArray:
    """A NumPy array posing as device memory."""

    def __init__(self, host: np.ndarray):
        self.host = host
        self.data = types.SimpleNamespace(ptr=host.ctypes.data)

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    strides = property(lambda self: self.host.strides)
    itemsize = property(lambda self: self.host.itemsize)

    def __getitem__(self, key):
        return DeviceArray(self.host[key])


class _Stream:
    def __init__(self, non_blocking=False):
        self.ptr = id(self)

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class _Event:
    def __init__(self, disable_timing=False):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class _Device:
    def __init__(self, index=0):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeCupy:
    """The module: ``cuda.Stream``, ``cuda.Event``, ``cuda.Device``,
    ``cuda.alloc_pinned_memory``, ``cuda.runtime.memcpy2DAsync`` and
    ``hostRegister``/``hostUnregister`` (noted in `registered`);
    `fail_after` copies succeed, then every copy raises (error paths)."""

    def __init__(self, fail_after: int | None = None):
        self.copies, self.fail_after, self._lock = 0, fail_after, threading.Lock()
        self.registered: list = []  # (address, bytes) page-locked now
        runtime = types.SimpleNamespace(setDevice=lambda d: None, memcpy2DAsync=self._memcpy2d,
                                        hostRegister=self._register,
                                        hostUnregister=self._unregister)
        self.cuda = types.SimpleNamespace(Stream=_Stream, Event=_Event, Device=_Device,
                                          alloc_pinned_memory=lambda n: bytearray(n),
                                          runtime=runtime)

    def _register(self, ptr, nbytes, flags):
        self.registered.append((ptr, nbytes))

    def _unregister(self, ptr):
        self.registered = [r for r in self.registered if r[0] != ptr]

    def _memcpy2d(self, dst, dpitch, src, spitch, width, height, kind, stream):
        with self._lock:
            self.copies += 1
            if self.fail_after is not None and self.copies > self.fail_after:
                raise RuntimeError("fake copy engine failure")
        for row in range(height):
            ctypes.memmove(dst + row * dpitch, src + row * spitch, width)
