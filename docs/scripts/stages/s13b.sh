# STAGE=s13b docs/scripts/gpu_session.sh
# session 13: the cores a rank may use under each launcher (Open MPI binds a rank
# to one core when it starts two or fewer), and a profile of the in-memory cold
# multiply's NaN/Inf scan (4.6 s cold, 0.06 warm)
    aff='import os; print("cores", len(os.sched_getaffinity(0)), "of", os.cpu_count())'
    run python3 -c "$aff"
    run mpirun -np 1 python3 -c "$aff"
    run mpirun --oversubscribe -np 1 python3 -c "$aff"
    run mpirun -np 2 python3 -c "$aff"
    run mpirun --bind-to none -np 1 python3 -c "$aff"
    run mpiexec -n 1 python3 -c "$aff"
    mkdir -p /tmp/summa-files
    run python3 -c "
import numpy as np
from numpy.lib import format as f
for name, seed in (('A', 1), ('B', 2)):
    out = f.open_memmap(f'/tmp/summa-files/{name}.npy', mode='w+', dtype='float64', shape=(24576, 24576))
    rng = np.random.default_rng(seed)
    for r in range(0, 24576, 2048):
        out[r:r + 2048] = rng.uniform(-1, 1, (2048, 24576))
    out.flush()
"
    LIMIT=120 run python3 docs/scripts/profile_multiply.py /tmp/summa-files/A.npy \
        /tmp/summa-files/B.npy /tmp/summa-files/C.npy --in-memory
    LIMIT=120 run python3 docs/scripts/profile_multiply.py /tmp/summa-files/A.npy \
        /tmp/summa-files/B.npy /tmp/summa-files/C.npy --top 12
    rm -rf /tmp/summa-files
