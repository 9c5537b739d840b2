# STAGE=files docs/scripts/gpu_session.sh
# issue 4: 32768^2 float64 .npy files end to end
    run python3 -c "
import numpy as np
from numpy.lib.format import open_memmap
rng = np.random.default_rng(1)
for name in ('A', 'B'):
    m = open_memmap('/tmp/' + name + '.npy', mode='w+', dtype=np.float64, shape=(32768, 32768))
    for r in range(0, 32768, 4096):
        m[r:r + 4096] = rng.uniform(-1, 1, (4096, 32768))
    m.flush()
"
    run $MPI -np 2 python3 -m summa multiply /tmp/A.npy /tmp/B.npy -o /tmp/C.npy --check \
        --quiet --json "$OUT/files.jsonl"
