"""Check the performance model against measurements on this machine.

For each rank count: calibrate (appending to one profile), then bench a few
sizes; finally print predicted against measured time for every run.

    python3 benchmarks/model_accuracy.py --ranks 1,2,4 --sizes 768,1536,2304 \\
        [--mpiexec "mpiexec"] [--bench-args "--backend numpy"] [--out DIR]

With --profile P --results R1.jsonl [R2.jsonl ...] it measures nothing and only
compares the runs already recorded in those files with the model of profile P.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from summa.planning.model import RunSetting, predict  # noqa: E402
from summa.planning.profile import Profile  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--ranks", default="1,2,4")
parser.add_argument("--sizes", default="768,1536,2304")
parser.add_argument("--mpiexec", default=os.environ.get("SUMMA_MPIEXEC", "mpiexec"))
parser.add_argument("--bench-args", default="")
parser.add_argument("--calibrate-args", default="")
parser.add_argument("--out", default=".")
parser.add_argument("--profile", default=None, help="with --results: the profile to use")
parser.add_argument("--results", nargs="*", default=None,
                    help="compare these recorded runs instead of measuring")
args = parser.parse_args()
if args.results is not None and not args.profile:
    parser.error("--results needs --profile")
profile_path = args.profile or os.path.join(args.out, "profile.json")
results_paths = args.results or [os.path.join(args.out, "validation.jsonl")]
if args.results is None:
    for path in (profile_path, *results_paths):
        if os.path.exists(path):
            os.unlink(path)
env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
launcher = shlex.split(args.mpiexec)
for p in [] if args.results is not None else [int(x) for x in args.ranks.split(",")]:
    run = launcher + ["-n", str(p), sys.executable, "-m", "summa"]
    subprocess.run(run + ["calibrate", "-o", profile_path, "--append"]
                   + shlex.split(args.calibrate_args), check=True, env=env)
    for size in args.sizes.split(","):
        subprocess.run(run + ["bench", "--size", size, "--repeat", "3", "--no-ideal",
                              "--json", results_paths[0]] + shlex.split(args.bench_args),
                       check=True, env=env, stdout=subprocess.DEVNULL)
profile = Profile.load(profile_path)
print(f"{'ranks':>5} {'grid':>5} {'N':>6} {'dtype':>8} {'nb':>5} {'measured s':>11} "
      f"{'model s':>9} {'model/measured':>15}")
worst = 0.0
records = [json.loads(line) for path in results_paths for line in open(path) if line.strip()]
for r in records:
    row = (f"{r['ranks']:>5} {r['grid'][0]}x{r['grid'][1]:<3} {r['m']:>6} {r['dtype']:>8} "
           f"{r['nb']:>5} {r['seconds']:>11.4f}")
    try:
        pred = predict(profile, r["m"], r["n"], r["k"], r["dtype"], tuple(r["grid"]), r["nb"],
                       RunSetting(lookahead=r["lookahead"], comm=r["comm"],
                                  precision=None if r.get("precision", "default") == "default"
                                  else r["precision"]))
    except ValueError as exc:  # e.g. auto's direct ipc copies, or a dtype not calibrated
        print(f"{row}  not modelled: {exc}")
        continue
    ratio = pred.seconds / r["seconds"]
    worst = max(worst, abs(ratio - 1))
    print(f"{row} {pred.seconds:>9.4f} {ratio:>15.3f}")
print(f"largest model error: {worst * 100:.1f} %")
