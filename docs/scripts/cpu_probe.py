import os, time, numpy as np
from concurrent.futures import ThreadPoolExecutor
print("cpu_count", os.cpu_count(), "affinity", len(os.sched_getaffinity(0)))
for p in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us", "/sys/fs/cgroup/cpuset.cpus.effective"):
    try: print(p, open(p).read().strip())
    except OSError as e: print(p, "-")
print(open("/proc/loadavg").read())
src = np.ones(1 << 28)  # 2 GiB touched
dst = np.ones(1 << 28)
for t in (1, 2, 4, 8, 12, 16):
    parts = np.array_split(np.arange(src.size), 64)
    sl = [(p[0], p[-1] + 1) for p in parts]
    with ThreadPoolExecutor(t) as pool:
        list(pool.map(lambda r: np.copyto(dst[r[0]:r[1]], src[r[0]:r[1]]), sl))
        s = time.perf_counter()
        list(pool.map(lambda r: np.copyto(dst[r[0]:r[1]], src[r[0]:r[1]]), sl))
        sec = time.perf_counter() - s
        fresh = np.empty(1 << 28)
        flat = fresh.view(np.uint8)
        s = time.perf_counter()
        list(pool.map(lambda r: flat[r[0] * 8:r[1] * 8:4096].fill(0), sl))
        tsec = time.perf_counter() - s
    print(f"threads {t:2d}: memcpy {src.nbytes / sec / 1e9:6.1f} GB/s, first touch {src.nbytes / tsec / 1e9:6.1f} GB/s", flush=True)
s = time.perf_counter(); x = 0
for i in range(3_000_000): x += i
print("python loop 3M", time.perf_counter() - s)
