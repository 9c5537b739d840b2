"""The benchmark scripts on this machine: every one answers --help without
its GPU libraries, and the matrix (benchmarks/matrix.py) runs its CPU-sized
cells through the same code as on a GPU, its values checked (not its times).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))  # last: its modules must not shadow the tests'

import calls  # noqa: E402
import matrix  # noqa: E402
import report  # noqa: E402


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")
                                          if "__main__" in p.read_text()))
def test_every_benchmark_answers_help_anywhere(script, tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout


JSON_WRITERS = sorted(p.name for p in BENCHMARKS.glob("*.py")
                      if re.search(r"add_argument\(\s*[\"']--json[\"']", p.read_text()))


@pytest.mark.parametrize("script", JSON_WRITERS)
def test_every_json_record_is_stamped_with_machine_date_and_command(script):
    """A script with --json writes its records through calls.append_json
    (which stamps them) and never a JSON line of its own."""
    text = (BENCHMARKS / script).read_text()
    assert "calls.append_json(" in text, f"{script} writes --json without calls.append_json"
    assert not re.search(r"\.write(lines)?\([^\n]*json\.dumps", text), \
        f"{script} writes a JSON line of its own, unstamped"


def test_the_stamp_names_machine_date_and_command_and_keeps_a_records_own(tmp_path):
    assert {"cuts.py", "matrix.py", "peers.py", "files.py", "memory_sequence.py"} \
        <= set(JSON_WRITERS)
    record = tmp_path / "r.jsonl"
    calls.append_json(str(record), {"seconds": 1.0, "command": "multiply"})
    calls.append_json(None, {"seconds": 2.0})  # no file: nothing written
    (row,) = _rows(record)
    assert set(calls.STAMPS) <= set(row) and row["seconds"] == 1.0
    assert row["machine"].split(",")[0].strip() and re.fullmatch(r"\d{4}-\d\d-\d\d", row["date"])
    assert row["command"].startswith("python3 ") and row["own_command"] == "multiply"


def test_cpu_sized_matrix_is_right_in_every_cell(tmp_path, capsys):
    record = tmp_path / "matrix.jsonl"
    assert matrix.main(["--cpu-sized", "--in-process", "--json", str(record)]) == 0
    rows = _rows(record)
    expected = matrix.cells(list(matrix.DTYPES), list(matrix.LAYOUTS), list(matrix.BUDGETS),
                            [calls.parse_size(matrix.PRESETS["cpu-sized"]["sizes"])])
    assert [r["name"] for r in rows] == [matrix.cell_name(c) for c in expected]
    for row in rows:
        if row["dtype"] == "fp64-int8" or row["layout"] == "cupy":
            if not row["gpu"]:  # they need one (on a GPU machine they run and are checked)
                assert row["status"] == "skipped", row
                continue
        assert row["status"] == "done", row
        assert row["first_residual"] <= 1 and row["again_residual"] <= 1, row
        assert row["reused_residual"] <= 1, row  # into the again call's product (out=)
        assert row["ceiling_seconds"] > 0 and row["again_seconds"] > 0 < row["reused_seconds"]
    out = capsys.readouterr().out
    assert f"{len(rows)} cells: 0 FAIL" in out


def test_matrix_cell_runs_in_a_fresh_process_on_a_tree(tmp_path, capsys):
    record = tmp_path / "matrix.jsonl"
    root = str(BENCHMARKS.parent)
    matrix.main(["--cpu-sized", "--dtypes", "complex64", "--layouts", "strided",
                 "--budgets", "8GiB", "--tree", f"this={root}", "--json", str(record)])
    # the machine warmed first, in a process of its own, its row not recorded
    assert re.search(r"\[warm-up this\] [\d.]+ s: complex64 [\d.]+ s", capsys.readouterr().out)
    (row,) = _rows(record)
    assert row["status"] == "done" and row["tree"] == "this", row
    assert max(row["first_residual"], row["again_residual"]) <= 1
    assert row["first_stats"]["extra"]["plan"]["dtype"] == "complex64"
    # the same command again, resumed: nothing left to run
    matrix.main(["--cpu-sized", "--dtypes", "complex64", "--layouts", "strided",
                 "--budgets", "8GiB", "--tree", f"this={root}", "--json", str(record),
                 "--resume"])
    assert len(_rows(record)) == 1


def test_matrix_warm_up_calls_each_dtype_whole_and_in_tiles(monkeypatch):
    """The warm-up runs summa.matmul of each dtype asked for, once whole and
    once under its device budget; fp64-int8 only where there is a GPU."""
    import summa
    made = []
    real = summa.matmul
    monkeypatch.setattr(summa, "matmul", lambda a, b, **kw: (
        made.append((a.dtype.name, kw.get("device_memory"), kw.get("precision"))),
        real(a[:64, :64], b[:64, :64], **kw))[1])
    monkeypatch.setattr("summa.device.backend.cupy_available", lambda: False)
    row = matrix.warm_up(["float32", "complex128", "fp64-int8"])
    assert made == [(d, budget, None) for d in ("float32", "complex128")
                    for budget in (None, matrix.WARM_BUDGET)]
    assert row["warm_up"] and set(row) == {"warm_up", "float32", "complex128"}
    assert all(row[d] > 0 for d in ("float32", "complex128"))


@pytest.mark.parametrize("layout", ["C", "F", "T", "strided", "trans"])
def test_matrix_operands_have_their_layout(layout):
    cell = {"dtype": "complex128", "layout": layout, "budget": "whole", "m": 5, "n": 3, "k": 4}
    a, b, options, A, B = matrix.operands(cell)
    assert A.shape == (5, 4) and B.shape == (4, 3) and A.dtype == np.complex128
    assert np.all(A.imag != 0)  # both parts filled
    if layout == "C":
        assert a.flags.c_contiguous and b.flags.c_contiguous
    if layout == "F":
        assert a.flags.f_contiguous and b.flags.f_contiguous and not a.flags.c_contiguous
    if layout == "T":
        assert a.base is not None and a.base.flags.c_contiguous and a.flags.f_contiguous
        assert b.flags.c_contiguous
    if layout == "strided":
        assert a.strides == (2 * 2 * 4 * 16, 2 * 16) and b.strides == (2 * 2 * 3 * 16, 2 * 16)
    if layout == "trans":
        assert options == {"trans_a": "T", "trans_b": "T"} and a.shape == (4, 5)
    else:
        assert options == {} and a is A


def _gpu_row(layout="C", dtype="float64", first=1.0, again=1.0, **extra):
    return {"dtype": dtype, "layout": layout, "budget": "24GiB", "m": 16384, "n": 16384,
            "k": 16384, "name": f"{dtype} {layout}", "tree": "here", "gpu": True,
            "status": "done", "first_seconds": first, "again_seconds": again,
            "first_residual": 0.1, "again_residual": 0.1, "ceiling_seconds": 0.9, **extra}


def test_matrix_verdicts_follow_the_issues_goals():
    c_row = _gpu_row()
    c_rows = {("float64", "24GiB", (16384,) * 3, "here", None): c_row}
    assert matrix.verdict(c_row, c_rows)[0] == "PASS"  # 0.9 of the ceiling
    assert matrix.verdict(_gpu_row(first=1.1), c_rows)[0] == "FAIL"  # float64 C: >= 0.88
    assert matrix.verdict(_gpu_row("F", first=1.08, again=1.05), c_rows)[0] == "FAIL"  # ceiling
    slow = _gpu_row("T", first=1.0, again=1.2, ceiling_seconds=1.1)
    result, why = matrix.verdict(slow, c_rows)
    assert result == "FAIL" and "C÷t" in why  # more than 10 % slower than the C call
    assert matrix.verdict(_gpu_row(dtype="fp64-int8", bare_seconds=0.6), {})[0] == "FAIL"
    assert matrix.verdict(_gpu_row(dtype="fp64-int8", bare_seconds=0.85), {})[0] == "PASS"
    # strided views: 0.8 of the larger of the link's and the GEMM's bound
    strided = _gpu_row("strided", transfer_seconds=2.0, first=2.4, again=2.4)
    assert matrix.verdict(strided, {})[0] == "PASS"
    assert matrix.verdict(dict(strided, first_seconds=3.0), {})[0] == "FAIL"
    gemm_bound = dict(strided, transfer_seconds=0.5, ceiling_seconds=2.0)
    assert matrix.verdict(gemm_bound, {})[0] == "FAIL"  # and 0.85 of the ceiling there
    wrong = _gpu_row(again_residual=3.0)
    assert matrix.verdict(wrong, {}) == ("FAIL", "wrong product (residual > 1)")
    wrong_into_out = _gpu_row(reused_residual=3.0)
    assert matrix.verdict(wrong_into_out, {}) == ("FAIL", "wrong product (residual > 1)")
    cupy = _gpu_row("cupy", ceiling_seconds=0.97, again_result="numpy")
    assert "not CuPy's" in matrix.verdict(cupy, {})[1]
    assert matrix.verdict(dict(cupy, again_result="cupy"), {})[0] == "PASS"
    tiny = dict(_gpu_row("F", first=9.0, again=9.0, transfer_seconds=1.0), m=96, n=80, k=112)
    assert matrix.verdict(tiny, {})[0] == "PASS"
    assert matrix.verdict(dict(tiny, first_residual=2.0), {})[0] == "FAIL"
    skipped = dict(_gpu_row("cupy"), status="skipped", reason="summa refuses CuPy arrays today")
    assert matrix.verdict(skipped, {}) == ("skip", "summa refuses CuPy arrays today")


def test_matrix_takes_best_of_rounds_and_prints_a_report(tmp_path, capsys):
    rows = [dict(_gpu_row(first=f, again=a), round=r) for r, (f, a) in
            enumerate([(1.3, 1.0), (1.0, 1.2)])]
    (best,) = matrix.best_of_rounds(rows)
    assert (best["first_seconds"], best["again_seconds"]) == (1.0, 1.0)
    record = tmp_path / "rows.jsonl"
    record.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert matrix.main(["--report", str(record)]) == 0
    assert "1 cells: 0 FAIL" in capsys.readouterr().out


def test_the_matrix_keeps_each_machines_figures_apart(tmp_path, capsys, monkeypatch):
    """Rows of one cell from two machines are two rows, each under its
    machine, its Fortran cell judged against its own machine's C cell; a
    resumed run skips only the cells this machine measured."""
    h100, h200 = "1 x NVIDIA H100 80GB HBM3, 16 cores", "1 x NVIDIA H200, 16 cores"
    rows = [dict(_gpu_row(first=2.0, again=2.0, ceiling_seconds=1.8), machine=h100),
            dict(_gpu_row(first=1.0, again=1.0), machine=h200),
            dict(_gpu_row("F", first=1.05, again=1.05, ceiling_seconds=1.0), machine=h200)]
    best = matrix.best_of_rounds(rows)
    assert sorted(r["again_seconds"] for r in best) == [1.0, 1.05, 2.0]
    record = tmp_path / "rows.jsonl"
    record.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert matrix.main(["--report", str(record)]) == 0
    out = capsys.readouterr().out
    assert out.index(f"-- {h100}") < out.index(f"-- {h200}") and "3 cells: 0 FAIL" in out
    # (against the H100's C cell, 2.0 s, the H200's Fortran one would pass either way;
    # against its own 1.0 s it is within 10 %: a slower one fails)
    rows[2].update(first_seconds=1.5, again_seconds=1.5)
    record.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert matrix.main(["--report", str(record)]) == 1
    capsys.readouterr()
    monkeypatch.setattr(matrix.calls, "stamps", lambda: {"machine": h100})
    cells = [dict(dtype="float64", layout=layout, budget="24GiB", m=16384, n=16384, k=16384)
             for layout in ("C", "F")]
    ran = []
    monkeypatch.setattr(matrix, "measure", lambda cell, *a: ran.append(cell["layout"]) or
                        dict(_gpu_row(cell["layout"]), status="done"))
    monkeypatch.setattr(matrix, "cell_name", lambda cell: f"float64 {cell['layout']}")
    args = SimpleNamespace(json=str(record), resume=True, rounds=1, in_process=True,
                           deadline=0, timeout=10)
    matrix.run_matrix(cells, {"here": None}, args)
    assert ran == ["F"]  # the H100 holds C only; the H200's F is not this machine's


def test_the_matrix_compares_trees_within_each_machine(tmp_path, capsys):
    """Two trees timed on two machines: each tree's again ÷ the first tree's
    on the same machine, never the other machine's."""
    rows = [dict(_gpu_row(again=again), tree=tree, machine=machine)
            for machine, tree, again in (("A", "here", 1.0), ("A", "new", 0.5),
                                         ("B", "here", 4.0), ("B", "new", 3.0))]
    record = tmp_path / "rows.jsonl"
    record.write_text("".join(json.dumps(r) + "\n" for r in rows))
    matrix.main(["--report", str(record)])
    lines = [line for line in capsys.readouterr().out.splitlines() if " new " in line]
    versus = [re.search(r" (\d\.\d{3})\s+(PASS|FAIL) ", line).group(1) for line in lines]
    assert versus == ["0.500", "0.750"]  # 0.5 ÷ 1.0 on A, 3.0 ÷ 4.0 on B


def test_matrix_refuses_unknown_names(capsys):
    with pytest.raises(SystemExit):
        matrix.main(["--layouts", "C,diagonal"])
    assert "unknown layouts: diagonal" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        matrix.main(["--sizes", "12x3"])


def test_cuts_times_the_planners_cut_and_those_asked_for_each_product_right(tmp_path):
    """benchmarks/cuts.py on the NumPy backend: one row per cut, each the cut
    it asked for (the planner's for "plan"), every product checked."""
    import cuts
    record = tmp_path / "cuts.jsonl"
    assert cuts.main(["--cpu", "--size", "96x320x128", "--budget", "1MiB", "--cuts",
                      "plan,1x2,3x1", "--rounds", "2", "--json", str(record)]) == 0
    rows = {row["cut"]: row for row in _rows(record)}
    assert set(rows) == {"plan", "1x2", "3x1"}
    assert rows["1x2"]["tiles"] == [1, 2] and rows["3x1"]["tiles"] == [3, 1]
    assert all(len(row["calls"]) == 2 and row["residual"] <= 1 for row in rows.values())


def test_gemm_forms_times_each_way_the_operands_lie(capsys):
    """benchmarks/gemm_forms.py on the NumPy backend: operands row- or
    column-major as asked, one line per dtype and shape with four rates."""
    import gemm_forms
    a = gemm_forms.operand(np, (5, 3), "complex128", "F")
    assert a.shape == (5, 3) and a.flags.f_contiguous and not a.flags.c_contiguous
    assert np.iscomplexobj(a) and np.abs(a.imag).max() > 0
    assert gemm_forms.operand(np, (5, 3), "float32", "C").flags.c_contiguous
    assert gemm_forms.main(["--cpu", "--dtypes", "complex128,float32", "--shapes",
                            "40x30x20", "--repeat", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.count("TFLOP/s") == 1 for line in lines)
    for line in lines:
        rates = [float(x) for x in line.split()[3:-1:2]]
        assert len(rates) == 4 and min(rates) > 0, line


def _peers(args, tmp_path, **environ):
    """benchmarks/peers.py with `args`, summa alone on the CPU (its bench
    told --backend numpy), from outside the tree."""
    env = dict(os.environ, **environ)
    return subprocess.run([sys.executable, str(BENCHMARKS / "peers.py"), "--size", "64",
                           "--gpus", "1", "--repeat", "1", "--peers", "summa",
                           "--summa-args", "--backend numpy", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _mpiexec() -> str:
    beside = Path(sys.executable).with_name("mpiexec")
    found = os.environ.get("SUMMA_MPIEXEC") or (str(beside) if beside.exists() else
                                                shutil.which("mpiexec"))
    if not found:
        pytest.skip("no mpiexec")
    return found


def test_peers_start_summa_under_the_launcher_run_exports(tmp_path):
    done = _peers(["--json", "peers.jsonl"], tmp_path, SUMMA_MPIEXEC=_mpiexec())
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    (row,) = [line for line in done.stdout.splitlines() if line.split()[:1] == ["summa"]]
    assert "FAILED" not in row and "grid=1x1" in row, row
    (record,) = _rows(tmp_path / "peers.jsonl")  # stamped with this run's command
    assert record["peer"] == "summa" and record["command"].endswith("--backend numpy --json "
                                                                    "peers.jsonl")
    assert record["machine"] and record["date"]


def test_peers_exit_non_zero_when_a_peer_failed(tmp_path):
    # a launcher that refuses to start anything, as MPICH's mpiexec refuses
    # Open MPI's --oversubscribe: the peer failed, and so does the run
    done = _peers(["--mpirun", "false"], tmp_path, SUMMA_MPIEXEC=_mpiexec())
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert "FAILED" in done.stdout and "failed: summa" in done.stderr


def test_peers_launcher_is_summa_mpiexec_then_mpiexec():
    import peers
    assert peers.default_launcher({"SUMMA_MPIEXEC": "srun -K", "MPIEXEC": "mpirun"}) == "srun -K"
    assert peers.default_launcher({"MPIEXEC": "mpirun --bind-to none"}) == \
        "mpirun --bind-to none"
    assert "oversubscribe" not in peers.default_launcher({})


def test_report_renders_the_table_of_a_benchmarks_own_records(tmp_path, capsys):
    record = tmp_path / "matrix.jsonl"
    assert matrix.main(["--cpu-sized", "--in-process", "--dtypes", "float64,float32",
                        "--layouts", "C", "--json", str(record)]) == 0
    rows = _rows(record)
    capsys.readouterr()
    assert report.main([str(record)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("### matrix.jsonl\n")
    assert f"Machine: {rows[0]['machine']}. Date: {rows[0]['date']}." in text
    assert f"Command: `{rows[0]['command']}`." in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    header = [x.strip() for x in table[0].strip("|").split("|")]
    assert header[:3] == ["name", "dtype", "layout"] and "first_seconds" in header
    assert len(table) == 2 + len(rows)
    for row, line in zip(rows, table[2:]):
        cells = dict(zip(header, (x.strip() for x in line.strip("|").split("|"))))
        assert cells["name"] == row["name"] and cells["status"] == row["status"]
        if row["status"] == "done":
            assert cells["first_seconds"] == f"{row['first_seconds']:.3g}"


def test_the_matrix_with_a_profile_records_and_judges_the_models_time(tmp_path, capsys):
    """--profile: each cell's row holds the model's seconds for the plan
    its calls ran (or why the profile cannot say), and a timed GPU cell
    passes only where that lies within MODEL_TOLERANCE of its again call."""
    record, profile = tmp_path / "matrix.jsonl", BENCHMARKS.parent / "summa/profiles/h200.json"
    assert matrix.main(["--cpu-sized", "--in-process", "--dtypes", "float64,complex128",
                        "--layouts", "C", "--budgets", "whole,8GiB", "--profile", str(profile),
                        "--json", str(record)]) == 0
    rows = _rows(record)
    assert len(rows) == 4 and all(r["profile"] == str(profile) for r in rows)
    for row in rows:  # the shipped profile has float64 samples, not complex128's
        if row["dtype"] == "float64":
            assert row["predicted_seconds"] > 0 and row["predicted_bound"], row
        else:
            assert "complex128" in row["model_error"], row
    assert "model÷again" in capsys.readouterr().out
    timed = dict(rows[0], gpu=True, m=16384, n=16384, k=16384, first_seconds=1.0,
                 again_seconds=1.0, ceiling_seconds=0.95, transfer_seconds=0.1)
    for predicted, result in ((1.05, "PASS"), (0.95, "PASS"), (1.12, "FAIL"), (0.88, "FAIL")):
        assert matrix.verdict(dict(timed, predicted_seconds=predicted), {})[0] == result
    assert matrix.verdict(dict(timed, predicted_seconds=1.12, profile=None), {})[0] == "PASS"
    with pytest.raises(SystemExit) as exit_:
        matrix.main(["--cpu-sized", "--profile", str(tmp_path / "none.json")])
    assert exit_.value.code == 2
