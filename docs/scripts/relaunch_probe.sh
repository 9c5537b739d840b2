#!/bin/bash
# Why `python -m summa multiply` without mpirun exits 1 silently under Open MPI as root.
python3 -c "import numpy as np; np.save('/tmp/A.npy', np.random.rand(30,20)); np.save('/tmp/B.npy', np.random.rand(20,25))"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "--- mpiexec hello"; timeout 30 mpiexec -n 3 python3 -c "print('hi')" < /dev/null; echo "rc=$?"
echo "--- mpiexec summa multiply"; timeout 60 mpiexec -n 3 python3 -m summa multiply /tmp/A.npy /tmp/B.npy -o /tmp/C1.npy --backend numpy < /dev/null; echo "rc=$?"
echo "--- relaunch, stdin /dev/null"; SUMMA_WORKERS=3 timeout 60 python3 -m summa multiply /tmp/A.npy /tmp/B.npy -o /tmp/C2.npy --backend numpy < /dev/null; echo "rc=$?"
echo "--- relaunch, verbose"; SUMMA_WORKERS=3 timeout 60 python3 -X faulthandler -c "
import sys, os; sys.argv=['summa','multiply','/tmp/A.npy','/tmp/B.npy','-o','/tmp/C3.npy','--backend','numpy']
from summa import __main__ as m; from summa.pool import _mpiexec, launched; print('mpiexec', _mpiexec(), 'launched', launched(), flush=True)
sys.exit(m.main())" < /dev/null; echo "rc=$?"
