"""Profile one ``multiply_files`` call in this process (cProfile), the files
evicted from the page cache first unless ``--warm``: where does a phase's time
go? ``python3 docs/scripts/profile_multiply.py A.npy B.npy C.npy [--in-memory]``
prints the calls with the most time of their own and the most in all."""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("out")
    p.add_argument("--in-memory", action="store_true")
    p.add_argument("--warm", action="store_true")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args()
    from summa.multiply import multiply_files
    print(f"cores this process may use: {len(os.sched_getaffinity(0))} of {os.cpu_count()}")
    if not args.warm:
        evict(args.a)
        evict(args.b)
    prof = cProfile.Profile()
    prof.enable()
    record = multiply_files(args.a, args.b, args.out, quiet=True,
                            out_of_core=False if args.in_memory else None)
    prof.disable()
    print("timeline:", record["timeline"])
    stats = pstats.Stats(prof).strip_dirs()
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    os.unlink(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
