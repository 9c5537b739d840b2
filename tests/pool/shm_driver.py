"""``python shm_driver.py CASE SEED [PRIVATE]``: run one case of
test_leftovers (a caller of the pool or of the command line, ended as CASE
says at a moment SEED draws) and print, as one JSON line, what it left in
/dev/shm.

Files are told apart as the job's by watching its processes while it runs
(every MPI file they map or hold open, and summa's files named after them),
since other runs on the machine add and remove files of their own. With
PRIVATE ("1") the driver runs in a mount namespace of its own over an empty
/dev/shm (``unshare -m``, test_leftovers starts it so where it can), and
every file new there counts."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from summa.runtime.cleanup import cuda_ipc_files, descendants, held_segments

SHM = "/dev/shm"

#: A plain process that multiplies on a pool of two workers, COUNT times
#: (0: until stopped); it says "ready" once summa is imported.
CALLER = """
import sys, numpy as np, summa
print("ready", flush=True)
a = np.ones((90, 90))
count = int(sys.argv[1])
i = 0
while count == 0 or i < count:
    summa.matmul(a, a, workers=2, backend="numpy", panel_width=16)
    i += 1
"""


class Watcher:
    """The shared-memory files a process and what it starts hold, sampled
    on a thread until :meth:`stop`."""

    def __init__(self, root: int):
        self.root, self.files, self.pids = root, set(), {root}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.is_set():
            pids = [self.root, *descendants(self.root)]
            self.pids.update(pids)
            for pid in pids:
                self.files.update(held_segments(pid))
                self.files.update(cuda_ipc_files(pid))
            self._done.wait(0.01)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def left(self, shm_dir: str) -> list[str]:
        """The files seen that still exist, and summa's of the processes seen."""
        named = [os.path.join(shm_dir, n) for n in _listing(shm_dir)
                 for pid in self.pids if n.startswith(f"summa-{pid}-")]
        return sorted(p for p in {*self.files, *named} if os.path.exists(p))


def _listing(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _adopt_orphans() -> None:
    """Make this process the one that adopts the orphans of what it starts
    (Linux's child subreaper): the guardian of a killed caller, started a
    moment before the kill, may not have been seen by the Watcher, and
    would not be found below the caller once it is dead."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _gone(pids, seconds: float) -> None:
    """Wait until every process of `pids` has ended (up to `seconds`)."""
    from summa.runtime.cleanup import process_alive
    deadline = time.monotonic() + seconds
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _command(case: str, folder: str, env: dict) -> tuple[list[str], dict]:
    """The command of `case` and its environment."""
    python = sys.executable
    if case.startswith("cli"):
        a, b = np.random.default_rng(1).uniform(-1, 1, (2, 60, 60))
        np.save(os.path.join(folder, "A.npy"), a)
        np.save(os.path.join(folder, "B.npy"), b)
        return ([python, "-m", "summa", "multiply", os.path.join(folder, "A.npy"),
                 os.path.join(folder, "B.npy"), "-o", os.path.join(folder, "C.npy"),
                 "--backend", "numpy"], dict(env, SUMMA_WORKERS="2"))
    if case == "pipe":  # the command's output into a reader that stops at once
        mpiexec = os.environ.get("SUMMA_MPIEXEC") or os.path.join(os.path.dirname(python),
                                                                  "mpiexec")
        line = (f"{mpiexec} -n 2 {python} -m summa bench --backend numpy --size 192 "
                "--repeat 50 | head -1")
        return ["sh", "-c", line], env
    script = os.path.join(folder, "caller.py")
    with open(script, "w") as fh:
        fh.write(CALLER)
    return [python, script, "3" if case == "calls" else "0"], env


def main() -> None:
    case, seed = sys.argv[1], int(sys.argv[2])
    private = sys.argv[3:] == ["1"]
    draw = random.Random(seed)
    folder = tempfile.mkdtemp(prefix="summa-leftovers-")
    env = dict(os.environ)
    if private:  # the test session's shared-memory folder is not in this /dev/shm
        env["SUMMA_SHM_DIR"] = SHM
    shm_dir = env.get("SUMMA_SHM_DIR", SHM)
    before = set(_listing(SHM))
    _adopt_orphans()
    command, env = _command(case, folder, env)
    t0 = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    watcher = Watcher(proc.pid)
    if case in ("interrupt", "kill"):
        assert proc.stdout.readline().strip() == "ready"
        # any moment of a pool's life: its start (about a second here), its calls
        time.sleep(draw.uniform(0.0, 2.5))
        stopped = time.monotonic()
        proc.send_signal(signal.SIGINT if case == "interrupt" else signal.SIGKILL)
    elif case == "cli-interrupt":  # a terminal's Ctrl-C: the whole foreground group
        time.sleep(draw.uniform(0.3, 2.5))
        stopped = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
    else:
        stopped = None
    out, err = proc.communicate(timeout=120)
    ended = time.monotonic()
    # the workers and the guardian of a killed caller clean up, then end
    _gone({*watcher.pids, *descendants(os.getpid())}, 15)
    watcher.stop()
    left = watcher.left(shm_dir)
    new = sorted(set(_listing(SHM)) - before) if private else None
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"case": case, "status": proc.returncode, "left": left, "new": new,
                      "seen": len(watcher.files), "stop_took": None if stopped is None
                      else ended - stopped, "took": ended - t0,
                      "banner": "BAD TERMINATION" in out + err, "stdout": out[:400],
                      "stderr": err[-1500:]}))


if __name__ == "__main__":
    main()
