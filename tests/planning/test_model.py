"""The performance model and the model/plot/calibrate commands."""

import io
import json
import time

import numpy as np
import pytest
from mpi4py import MPI

from summa import cli
from summa.planning.model import RunSetting, TimeSplit, predict, recommend, sweep
from summa.planning.profile import Profile

GEMM_RATE = 50e12  # flop/s in every sample
BCAST = dict(alpha=10e-6, beta=300e9)


def make_profile(overlap=True, overhead=0.0):
    gemm = [dict(dtype="float64", precision="default", ranks_per_node=1, m=m, n=m, k=k,
                 seconds=2.0 * m * m * k / GEMM_RATE)
            for m in (4096, 16384) for k in (1024, 4096, 16384)]
    bcast = [dict(comm="nccl", ranks=r, overlap=overlap, **BCAST) for r in (2, 4)]
    return Profile(dict(gemm=gemm, bcast=bcast, overhead=[dict(ranks=2, seconds=overhead)]))


def test_one_rank_is_one_gemm():
    pred = predict(make_profile(), 16384, 16384, 16384, "float64", (1, 1), 4096)
    assert pred.seconds == pytest.approx(2 * 16384**3 / GEMM_RATE)
    assert pred.efficiency == 1.0 and pred.panels == 1


def test_lookahead_hides_broadcasts_and_without_it_they_add_up():
    prof = make_profile()
    m = 32768
    with_la = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(lookahead=1))
    without = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(lookahead=0))
    t_c = 2 * (m // 2) * m * 4096 / GEMM_RATE
    t_b = BCAST["alpha"] + 4096 * m * 8 / BCAST["beta"]
    assert with_la.panel_compute == pytest.approx(t_c)
    assert with_la.panel_comm == pytest.approx(t_b)
    assert with_la.seconds == pytest.approx(t_b + 8 * max(t_c, t_b))
    assert without.seconds == pytest.approx(8 * (t_c + t_b))
    assert with_la.efficiency < 1 and with_la.efficiency > without.efficiency
    cpu_like = predict(make_profile(overlap=False), m, m, m, "float64", (2, 1), 4096)
    assert cpu_like.seconds == pytest.approx(without.seconds)


def test_own_panels_first_leave_no_pipeline_fill():
    """2 x 1 grid, 4 panels: each rank multiplies its own 2 while all 4
    broadcasts run, then the 2 it received; without lookahead, the sum."""
    prof = make_profile()
    m = 16384
    pred = predict(prof, m, m, m, "float64", (2, 1), 4096)
    t_c, t_b = pred.panel_compute, pred.panel_comm
    assert pred.panels == 4
    assert pred.seconds == pytest.approx(max(2 * t_c, 4 * t_b) + 2 * t_c)
    assert pred.seconds < t_b + 4 * max(t_c, t_b)  # the common order's fill is gone
    assert predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(lookahead=0)).seconds == \
        pytest.approx(4 * (t_c + t_b))
    # a 1 x 2 grid packs its A panels: the common order, with its fill
    row = predict(prof, m, m, m, "float64", (1, 2), 4096)
    assert row.seconds == pytest.approx(row.panel_comm + 4 * max(row.panel_compute,
                                                                 row.panel_comm))


def test_direct_copies_take_own_panels_first_and_hide_the_opening():
    """ipc: no pipeline fill where a rank holds panels (a 1-D grid), no slowdown,
    and the peers' blocks open behind the own GEMMs; one node only."""
    prof = make_profile()
    for b in prof.bcast:
        b["gemm_slowdown"] = 1.05
    prof.bcast.append(dict(comm="ipc", ranks=2, overlap=True, alpha=20e-6, beta=150e9))
    m = 32768
    pred = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(comm="ipc"))
    t_c, t_b = pred.panel_compute, pred.panel_comm
    assert t_b == pytest.approx(20e-6 + 4096 * m * 8 / 150e9)
    # 8 panels, 4 its own; one 4 GiB B block to open (the "large" cost)
    assert pred.seconds == pytest.approx(max(4 * t_c, 0.02 + t_b) + 4 * max(t_c, t_b))
    nccl = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(comm="nccl"))
    assert pred.seconds < nccl.seconds
    assert predict(prof, m, m, m, "float64", (2, 1), 4096).seconds == pred.seconds  # auto
    # across nodes auto cannot copy directly
    assert predict(prof, m, m, m, "float64", (2, 1), 4096,
                   RunSetting(ranks_per_node=1)).seconds == \
        nccl.seconds
    # more ranks than ipc was calibrated on (one node of 2): NCCL's figures
    four = predict(prof, m, m, m, "float64", (4, 1), 4096)
    assert four.seconds == predict(prof, m, m, m, "float64", (4, 1), 4096,
                                   RunSetting(comm="nccl")).seconds
    # a 2-D grid: the slowest rank holds no panel and waits for the opening
    square = predict(prof, m, m, m, "float64", (2, 2), 4096, RunSetting(comm="ipc"))
    t_c2, t_b2 = square.panel_compute, square.panel_comm
    assert square.seconds == pytest.approx(0.02 + 0.02 + t_b2 + 8 * max(t_c2, t_b2))


def test_direct_copies_open_nothing_where_the_blocks_stay_open():
    """Blocks up to 1/64 of the profile's device memory stay open from the
    multiply before (summa/transports/ipc.py): the repeated multiply opens nothing, which
    matters where the own GEMMs are too short to hide the opening."""
    prof = make_profile()
    prof.bcast.append(dict(comm="ipc", ranks=2, overlap=True, alpha=20e-6, beta=150e9))
    m = 8192  # a 2 x 1 grid: one 256 MiB float64 B block to open (the small cost)
    unknown = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(comm="ipc"))
    t_c, t_b = unknown.panel_compute, unknown.panel_comm
    assert unknown.seconds == pytest.approx(max(t_c, 0.002 + t_b) + max(t_c, t_b))
    prof.data["device_memory"] = 64 * (m // 2) * m * 8  # the block just stays open
    kept = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(comm="ipc"))
    assert kept.seconds == pytest.approx(max(t_c, t_b) + max(t_c, t_b))
    prof.data["device_memory"] -= 64  # one byte too small: opened every time
    assert predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(comm="ipc")).seconds == \
        pytest.approx(unknown.seconds)


def test_gemms_slowed_beside_broadcasts_lengthen_each_step():
    prof = make_profile()
    m = 32768
    base = predict(prof, m, m, m, "float64", (2, 1), 4096)
    for b in prof.bcast:
        b["gemm_slowdown"] = 1.05
    shared = predict(prof, m, m, m, "float64", (2, 1), 4096)
    t_c, t_b = base.panel_compute, base.panel_comm
    assert shared.seconds == pytest.approx(t_b + 8 * max(1.05 * t_c, t_b))
    assert prof.gemm_slowdown("nccl", 64) == 1.05 and prof.gemm_slowdown("mpi", 2) == 1.0
    # without lookahead nothing runs beside the GEMMs
    assert predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(lookahead=0)).seconds == \
        pytest.approx(predict(make_profile(), m, m, m, "float64", (2, 1), 4096,
                              RunSetting(lookahead=0)).seconds)


@pytest.mark.mpi(min_size=2)
def test_gemm_slowdown_is_measured_and_agreed(comm):
    from summa.device.backend import NumpyBackend
    from summa.cli.calibrate import gemm_slowdown
    from summa.transports.broadcasters import make_broadcaster
    backend = NumpyBackend()
    samples = [dict(dtype="float64", m=96, n=96, k=k, seconds=s)
               for k, s in ((32, 1e-5), (64, 2e-5))]
    bc = make_broadcaster("mpi", comm, backend)
    try:
        slowdown = gemm_slowdown(comm, backend, bc, samples, beta=1e9, repeat=2)
    finally:
        bc.free()
    assert slowdown >= 1.0
    assert comm.allgather(slowdown) == [slowdown] * comm.size


def test_default_calibration_sizes_on_cpu(comm):
    from summa.device.backend import NumpyBackend
    from summa.cli.calibrate import default_sizes
    assert default_sizes(comm, NumpyBackend(), ["float64"]) == [256, 512, 1024, 2048]


def test_without_a_comm_the_fastest_calibrated_broadcaster_is_assumed():
    prof = make_profile()
    prof.bcast.append(dict(comm="mpi", ranks=2, overlap=True, alpha=60e-6, beta=6e9))
    m = 32768
    auto = predict(prof, m, m, m, "float64", (2, 1), 4096)
    nccl = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(comm="nccl"))
    mpi = predict(prof, m, m, m, "float64", (2, 1), 4096, RunSetting(comm="mpi"))
    assert mpi.seconds > nccl.seconds and auto.seconds == nccl.seconds


def test_overhead_and_extrapolated_broadcasts():
    prof = make_profile(overhead=1e-3)
    base = predict(make_profile(), 8192, 8192, 8192, "float64", (2, 1), 1024)
    slower = predict(prof, 8192, 8192, 8192, "float64", (2, 1), 1024)
    assert slower.seconds == pytest.approx(base.seconds + 8 * 1e-3)
    # 64 ranks were never calibrated: latency grows with log2 P, bandwidth stays
    far = prof.bcast_seconds(1e9, 64, "nccl")
    assert far == pytest.approx(BCAST["alpha"] * 6 / 2 + 1e9 / BCAST["beta"])


def test_recommend_and_sweep():
    prof = make_profile()
    best = recommend(prof, 32768, 32768, 32768, "float64", 4)
    assert best.grid in ((1, 4), (2, 2), (4, 1))
    strong = sweep(prof, 16384, "float64", ranks=(1, 2, 4, 8))
    assert [p for p, _, _ in strong] == [1, 2, 4, 8]
    assert all(n == 16384 for _, n, _ in strong)
    times = [pred.seconds for _, _, pred in strong]
    assert times == sorted(times, reverse=True), "more ranks, less time"
    weak = sweep(prof, 16384, "float64", ranks=(1, 8), weak=True)
    assert weak[1][1] == 32768


@pytest.mark.parametrize("backend, dtype, expect", [("cupy on GPU 0 (H200)", "float64", (1, 2)),
                                                    ("cupy on GPU 0 (H200)", "float32", (2, 1)),
                                                    ("numpy", "float64", (2, 1))])
def test_recommend_breaks_ties_as_bench_does(backend, dtype, expect):
    """The model predicts 1x2 and 2x1 alike where nothing breaks the symmetry
    (no own-first, no overlap): it then recommends bench's default grid."""
    prof = make_profile(overlap=False)
    for g in prof.gemm:
        g["dtype"] = dtype
    prof.data["backend"] = backend
    m = 16384
    one, two = (predict(prof, m, m, m, dtype, g, 4096).seconds for g in ((1, 2), (2, 1)))
    assert one == two
    assert recommend(prof, m, m, m, dtype, 2, widths=(4096,)).grid == expect


def test_profile_errors(tmp_path):
    with pytest.raises(ValueError, match="no such profile"):
        Profile.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON profile"):
        Profile.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="non-empty 'gemm'"):
        Profile({"gemm": []})
    with pytest.raises(ValueError, match="no GEMM samples for float32"):
        predict(make_profile(), 100, 100, 100, "float32", (1, 1), 64)
    with pytest.raises(ValueError, match="no broadcast samples for comm 'mpi'"):
        predict(make_profile(), 100, 100, 100, "float64", (2, 1), 64, RunSetting(comm="mpi"))


@pytest.mark.mpi(min_size=1)
def test_model_command_prints_prediction_and_sweep(comm, tmp_path_factory):
    path = comm.bcast(str(tmp_path_factory.mktemp("prof") / "p.json") if comm.rank == 0
                      else None)
    if comm.rank == 0:
        make_profile().save(path)
    comm.Barrier()
    out = io.StringIO()
    assert cli.main(["model", "--profile", path, "--size", "32768", "--ranks", "2"],
                    comm, out) == 0
    assert cli.main(["model", "--profile", path, "--sweep", "--ranks-list", "1,2,4,64"],
                    comm, out) == 0
    if comm.rank == 0:
        text = out.getvalue()
        assert "predicted" in text and "recommended: grid" in text
        assert "strong scaling" in text and "weak scaling" in text
        assert "\n    64 " in text


@pytest.mark.mpi(min_size=1)
def test_calibrate_writes_a_usable_profile(comm, tmp_path_factory):
    path = comm.bcast(str(tmp_path_factory.mktemp("cal") / "p.json") if comm.rank == 0
                      else None)
    out = io.StringIO()
    args = ["calibrate", "-o", path, "--sizes", "64,128", "--widths", "16,32", "--repeat", "1",
            "--backend", "numpy"]
    assert cli.main(args, comm, out) == 0
    assert cli.main(args + ["--append"], comm, out) == 0
    if comm.rank == 0:
        prof = Profile.load(path)
        assert len(prof.gemm) == 2 * 6
        assert all(g["seconds"] > 0 for g in prof.gemm)
        if comm.Get_size() > 1:
            assert {b["ranks"] for b in prof.bcast} == set(range(2, comm.Get_size() + 1))
            assert all(b["beta"] > 0 and b["overlap"] is False for b in prof.bcast)
        pred = predict(prof, 256, 256, 256, "float64", (comm.Get_size(), 1), 32,
                       RunSetting(comm="mpi"))
        assert pred.seconds > 0
        # the nodes' memcpy rate: one copier alone, then every rank of the node
        memory = prof.host_memory()
        copiers = [c for c, _ in memory["copy_gbs"]]
        assert copiers[0] == 1 and comm.Get_size() in copiers  # one node here
        assert all(gbs > 0 for _, gbs in memory["copy_gbs"]) and not memory["estimate"]
        assert prof.cores >= 1 and prof.host_copy_gbs(comm.Get_size()) > 0
        assert "; host memory memcpy " in out.getvalue()
        assert prof.host_link() is None and "host link" not in out.getvalue()  # CPU ranks


class _SmallGPU:
    """A backend that says it is a GPU with `free` bytes free (calibrate's checks)."""
    is_gpu = True

    def __init__(self, free):
        self.free = free

    def memory_free(self):
        return self.free


def test_calibrate_refuses_sizes_whose_operands_do_not_fit_before_making_them():
    from summa.cli.calibrate import _check_operands_fit
    _check_operands_fit(MPI.COMM_SELF, _SmallGPU(3 * 1024 ** 2 * 8 * 2), 1024, 1024,
                        "float64", False)
    with pytest.raises(ValueError, match=r"calibrate --sizes 32768: the float64 operands need"):
        _check_operands_fit(MPI.COMM_SELF, _SmallGPU(24 << 30), 32768, 32768, "float64", True)


def test_calibrated_fp64_int8_gemms_take_rows_in_chunks_that_fit_as_a_run_would():
    """A 32768 block's fp64-int8 GEMM over K = 32768 took all of C's rows at
    once and ran an H100 out of memory (~48 GiB left beside its operands);
    now its rows come in chunks that fit what is free (the plan's choice),
    and all at once where they fit."""
    from summa.cli.calibrate import _scheme_that_fits
    from summa.planning.memory import resident_plan
    from summa.precision.ozaki_gpu import Scheme
    asked = Scheme(moduli=15)
    scheme = _scheme_that_fits(MPI.COMM_SELF, _SmallGPU(48 << 30), asked, 32768, 32768,
                               "float64", "fp64-int8")
    assert scheme.moduli == 15 and scheme.rows is not None and scheme.rows < 32768
    need = resident_plan(32768, 32768, 32768, "float64", "fp64-int8", new_c=False,
                         budget=10 ** 15)
    assert need.device_bytes > 48 << 30  # it would not have fit whole
    roomy = _scheme_that_fits(MPI.COMM_SELF, _SmallGPU(10 ** 12), asked, 4096, 4096,
                              "float64", "fp64-int8")
    assert roomy.rows is None
    assert _scheme_that_fits(MPI.COMM_SELF, _SmallGPU(1), None, 64, 64, "float64", None) is None
    with pytest.raises(ValueError, match="even in its smallest chunks"):
        _scheme_that_fits(MPI.COMM_SELF, _SmallGPU(1 << 20), asked, 32768, 32768, "float64",
                          "fp64-int8")


def test_a_merged_profile_takes_the_host_link_measured_last():
    """`calibrate --append` on a GPU measures the link again: the newer rates
    replace the older, and a profile without one keeps what it had."""
    def link(gbs):
        return dict(name="host link (measured)", h2d_gbs=gbs, d2h_gbs=gbs / 2,
                    pinned_h2d_gbs=50.0, pinned_d2h_gbs=50.0)
    old, new = make_profile(), make_profile()
    old.data["host_link"], new.data["host_link"] = link(10.0), link(30.0)
    assert old.merge(new).host_seconds(30e9, 15e9) == pytest.approx(2.0)
    assert new.merge(make_profile()).host_link()["h2d_gbs"] == 30.0


def test_plot_draws_measured_points_and_model_curves(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "r.jsonl"
    with open(results, "w") as fh:
        for p, secs, eff in ((1, 1.4, 1.0), (2, 0.72, 0.95)):
            fh.write(json.dumps(dict(m=32768, n=32768, k=32768, dtype="float64", ranks=p,
                                     seconds=secs, efficiency=eff, comm="nccl",
                                     precision="default")) + "\n")
    make_profile().save(tmp_path / "p.json")
    out = io.StringIO()
    png = tmp_path / "s.png"
    from mpi4py import MPI
    assert cli.main(["plot", str(results), "-o", str(png), "--profile",
                     str(tmp_path / "p.json")], MPI.COMM_SELF, out) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000
    assert "2 measured runs" in out.getvalue()


@pytest.mark.mpi(min_size=2)
def test_calibrate_leaves_out_an_optional_broadcaster_that_fails(comm, monkeypatch):
    """`calibrate --comm all` tries ipc where all ranks share a node; where CUDA IPC
    is refused there, the profile simply has no ipc samples. A broadcaster asked
    for by name that fails still ends the calibration."""
    from summa.cli import calibrate as cal
    from summa.device.backend import NumpyBackend
    real = cal._bcast_fit

    def fit(sub, backend, mode, *args):
        if mode == "flaky":
            raise RuntimeError("ipc broadcaster: rank 0 cannot export CUDA IPC handles")
        return real(sub, backend, mode, *args)
    monkeypatch.setattr(cal, "_bcast_fit", fit)
    kwargs = dict(sizes=[64], widths=[16], message_bytes=(8, 1 << 12), repeat=1)
    prof = cal.calibrate(comm, NumpyBackend(), modes=("mpi", "flaky"), optional=("flaky",),
                         **kwargs)
    if comm.rank == 0:
        assert prof.comm_modes() == ["mpi"]
        assert "device_memory" not in prof.data  # host memory: not a device's
    # a device's memory is recorded: the model's direct copies need it
    monkeypatch.setattr(NumpyBackend, "memory_total", lambda self: 141 << 30)
    prof = cal.calibrate(comm, NumpyBackend(), modes=("mpi",), **kwargs)
    if comm.rank == 0:
        assert prof.data["device_memory"] == 141 << 30
    with pytest.raises(RuntimeError, match="cannot export"):
        cal.calibrate(comm, NumpyBackend(), modes=("mpi", "flaky"), **kwargs)


@pytest.mark.mpi(min_size=1)
def test_calibrate_runs_under_the_watchdog(comm, tmp_path_factory, monkeypatch):
    """calibrate waits on the other ranks: it runs watched (SUMMA_TIMEOUT), and a
    bad SUMMA_TIMEOUT is a usage error there too."""
    entered = []

    class Recorder:
        def __init__(self, timeout, comm):
            entered.append(timeout)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(cli, "Watchdog", Recorder)
    path = comm.bcast(str(tmp_path_factory.mktemp("wd") / "p.json") if comm.rank == 0
                      else None)
    args = ["calibrate", "-o", path, "--sizes", "64", "--widths", "16", "--repeat", "1",
            "--backend", "numpy"]
    monkeypatch.setenv("SUMMA_TIMEOUT", "42")
    assert cli.main(args, comm, io.StringIO()) == 0
    assert entered == [42.0]
    monkeypatch.setenv("SUMMA_TIMEOUT", "soon")
    with pytest.raises(cli.UsageError, match="SUMMA_TIMEOUT must be a number"):
        cli.main(args, comm, io.StringIO())


def test_model_takes_the_panel_width_bench_takes():
    """Given a grid and no --nb, `model` predicts the width bench and multiply
    would use (fp64-int8's is wider than the usual list), and recommend
    weighs it too: the shipped H200 profile measured fp64-int8 up to K = 32768."""
    from summa.planning.profile import shipped_profile
    from summa.planning.tuning import default_panel_width
    path = shipped_profile()
    wide = default_panel_width("cupy", "float64", "fp64-int8")
    for args, width in ((["--precision", "fp64-int8"], wide),
                        ([], default_panel_width("cupy", "float64"))):
        out = io.StringIO()
        assert cli.main(["model", "--profile", path, "--size", "65536", "--grid", "1x2"] + args,
                        MPI.COMM_SELF, out) == 0
        assert f"grid 1x2, nb {width}," in out.getvalue(), out.getvalue()
    best = recommend(Profile.load(path), 65536, 65536, 65536, "float64", 8,
                     precision="fp64-int8")
    assert best.panel_width == wide  # 8192 and narrower pay a reconstruction per panel


@pytest.mark.parametrize("profile,grids", [("h200.json", ("1x2", "2x1", "2x1", "1x2")),
                                           ("rtx3090x8.json", ("2x4", "8x1", "4x2", "1x8"))])
@pytest.mark.parametrize("which,extra", [(0, []), (1, ["--nb", "256"]), (2, ["--nb", "8192"]),
                                         (3, ["--precision", "fp64-int8"])])
def test_model_never_recommends_a_setup_it_predicts_slower(profile, grids, which, extra):
    """The recommended grid and width are predicted no slower than the setup
    given, whatever the width's distance from the profile's samples."""
    import os
    import re
    from summa.planning.profile import shipped_profile
    path = os.path.join(os.path.dirname(shipped_profile()), profile)
    out = io.StringIO()
    setup = ["--grid", grids[which], *extra]  # grids of the profile's GPUs
    assert cli.main(["model", "--profile", path, "--size", "100000"] + setup,
                    MPI.COMM_SELF, out) == 0
    text = out.getvalue()
    given = float(re.search(r"predicted ([0-9.]+) s", text).group(1))
    named = re.search(r"recommended: grid \S+, nb \d+ \(([0-9.]+) s\)", text)
    assert named is None or float(named.group(1)) < given, text
    assert named is not None or "recommended: this setup" in text, text


def test_hardware_by_name_is_its_shipped_profile_and_the_plan_says_which():
    """``--hardware NAME`` predicts what ``--profile`` of that shipped file
    does, and plan and model name the hardware they assumed, also when none
    was given."""
    from summa.planning.profile import HARDWARE, hardware_profile
    common = ["--size", "100000", "--grid", "2x1"]
    for command in ("plan", "model"):
        for name in HARDWARE:
            by_name, by_file = io.StringIO(), io.StringIO()
            assert cli.main([command, *common, "--hardware", name], MPI.COMM_SELF, by_name) == 0
            assert cli.main([command, *common, "--profile", hardware_profile(name)],
                            MPI.COMM_SELF, by_file) == 0
            predicted = [line for line in by_name.getvalue().splitlines() if "predicted" in line]
            assert predicted and all(line in by_file.getvalue() for line in predicted)
            assert f"hardware: {name}, {HARDWARE[name]}" in by_name.getvalue()
        default = io.StringIO()
        assert cli.main([command, *common], MPI.COMM_SELF, default) == 0
        assert "hardware: h200" in default.getvalue()
        assert "no --hardware or --profile given" in default.getvalue()


def test_a_time_split_combines_its_overlapped_parts_and_adds_the_rest():
    """max(overlapped) + the other counted parts + exposed; parts without
    rates (None) and the disk are not in it; the bound is the largest part."""
    ooc = TimeSplit(gemm=4.0, host_link=6.0, gpu_links=1.0, exposed=0.5,
                    overlapped=("gemm", "host_link", "gpu_links"), disk=100.0)
    assert ooc.seconds == 6.5 and ooc.bound() == ("host_link", 6.0)
    in_memory = TimeSplit(4.0, 6.0, 1.0, 0.5, ("gemm", "gpu_links"))
    assert in_memory.seconds == 10.5 and in_memory.bound() == ("host_link", 6.0)
    unknown = TimeSplit(4.0, None, 5.0, 0.0, ("gemm", "host_link", "gpu_links"))
    assert unknown.seconds == 5.0 and unknown.bound() == ("gpu_links", 5.0)
    assert unknown.as_dict() == {"gemm": 4.0, "host_link": None, "host_memory": None,
                                 "gpu_links": 5.0, "exposed": 0.0,
                                 "overlapped": ["gemm", "host_link", "gpu_links"], "disk": None}


def test_the_host_memory_is_one_side_of_the_host_copies():
    """The node's host memory and the host link are two sides of one set of
    copies: out of core both overlap the GEMMs; in memory the copies add
    the longer of the two, never both; either can bound the run."""
    ooc = TimeSplit(4.0, 6.0, 1.0, 0.5, ("gemm", "host_link", "host_memory", "gpu_links"),
                    host_memory=7.0)
    assert ooc.seconds == 7.5 and ooc.bound() == ("host_memory", 7.0)
    for memory, copies in ((3.0, 6.0), (9.0, 9.0)):
        in_memory = TimeSplit(4.0, 6.0, 1.0, 0.5, ("gemm", "gpu_links"), host_memory=memory)
        assert in_memory.seconds == 4.0 + copies + 0.5
        assert in_memory.bound()[1] == copies


def test_host_copy_rates_time_each_count_of_copiers(monkeypatch):
    """The memcpy rate of a node's copiers: as many threads as asked copy
    their bytes each (every byte once), and the rate is the bytes copied
    over the time taken: copies made slower by a known delay give the
    rate that delay allows."""
    from summa.cli import calibrate as cal
    copied = []
    real = np.copyto

    def slow(dst, src, **kwargs):
        copied.append(src.size)
        time.sleep(0.02)
        real(dst, src, **kwargs)
    monkeypatch.setattr(cal.np, "copyto", slow)
    nbytes = 4 * (1 << 16)
    monkeypatch.setattr(cal, "CHUNK_BYTES", 1 << 16)
    rates = dict(cal.host_copy_rates(MPI.COMM_SELF, 3, nbytes=nbytes, repeat=1))
    assert set(rates) == {1, 3}
    # warm-up and one timed run of each count (1 alone, 1 on every rank, 3)
    assert sum(copied) == 2 * (nbytes + nbytes + 3 * nbytes)
    for copiers, gbs in rates.items():  # four chunks a thread, each at least 20 ms
        assert 0 < gbs <= copiers * nbytes / (4 * 0.02) / 1e9


def test_the_host_memory_rate_follows_its_copiers_and_its_traffic():
    """The node's memcpy rate by copiers: a calibrated count's own, linear
    between two, the most's past the most, the fewest's a thread below
    them; the time is the traffic over MEMCPY_TRAFFIC times that rate:
    twice the bytes, twice the time."""
    from summa.planning.profile import MEMCPY_TRAFFIC
    prof = make_profile()
    assert prof.host_memory() is None and prof.host_memory_seconds(1e9, 4) is None
    prof.data["host_memory"] = {"copy_gbs": [[4, 40.0], [16, 100.0]], "cores": 64}
    assert prof.cores == 64
    assert prof.host_copy_gbs(4) == 40.0 and prof.host_copy_gbs(10) == pytest.approx(70.0)
    assert prof.host_copy_gbs(64) == 100.0 and prof.host_copy_gbs(2) == pytest.approx(20.0)
    one = prof.host_memory_seconds(300e9, 16)
    assert one == pytest.approx(300e9 / (MEMCPY_TRAFFIC * 100e9))
    assert prof.host_memory_seconds(600e9, 16) == pytest.approx(2 * one)


def test_profiles_name_their_links_disk_and_memory_where_they_have_them():
    prof = make_profile()
    assert prof.device_memory is None and prof.peer_access and prof.host_link() is None
    assert prof.host_seconds(1e9, 1e9) is None and prof.disk_seconds(1e9, 1e9) is None
    prof.data.update(device_memory=24 << 30, peer_access=False,
                     host_link={"h2d_gbs": 10.0, "d2h_gbs": 5.0},
                     disk={"read_gbs": 2.0, "write_gbs": 1.0})
    assert prof.device_memory == 24 << 30 and not prof.peer_access
    assert prof.host_seconds(20e9, 10e9) == pytest.approx(2.0 + 2.0)
    assert prof.disk_seconds(4e9, 1e9) == pytest.approx(2.0 + 1.0)
    from summa.planning.profile import HARDWARE, hardware_profile
    for name in HARDWARE:  # every shipped profile knows its GPUs and their host link
        shipped = Profile.load(hardware_profile(name))
        assert shipped.device_memory and shipped.host_link()
        assert shipped.host_link()["note"] and shipped.host_link()["concurrency"]


def test_predictions_say_which_broadcaster_and_how_many_panels_each_rank_receives():
    prof = make_profile()
    one = predict(prof, 4096, 4096, 4096, "float64", (1, 1), 1024)
    assert one.comm is None and one.received == 0
    two = predict(prof, 4096, 4096, 4096, "float64", (2, 2), 1024)
    assert two.comm == "nccl" and two.received == two.panels == 4


@pytest.mark.parametrize("args", [
    ["--size", "100000", "--grid", "2x4", "--hardware", "rtx3090x8"],
    ["--size", "100000", "--grid", "2x4", "--hardware", "rtx3090x8", "--precision", "fp64-int8"],
    ["--size", "65536", "--ranks", "2"],
    ["--m", "30000", "--n", "8000", "--k", "20000", "--ranks", "4", "--hardware", "rtx3090x8"],
    ["--size", "32768", "--ranks", "1", "--device-memory", "8GiB"],
])
def test_plan_and_model_take_the_same_setup_by_default(args):
    """Given the same options, ``model`` predicts the grid, panel width and
    mode (in memory, or out of core and its tiles) ``plan`` prints: both
    plan on the profile's device memory; model recommends another setup
    only beside it."""
    import re
    plan, model = io.StringIO(), io.StringIO()
    assert cli.main(["plan", *args], MPI.COMM_SELF, plan) == 0
    assert cli.main(["model", *args], MPI.COMM_SELF, model) == 0
    planned = re.search(r"\(grid (\d+x\d+)\), nb (\d+),", plan.getvalue())
    modelled = re.search(r"grid (\d+x\d+), nb (\d+), lookahead", model.getvalue())
    assert planned and modelled and planned.groups() == modelled.groups(), \
        (plan.getvalue(), model.getvalue())
    tiles = re.search(r"C tiles of (\d+ x \d+) \((\d+ x \d+) per rank\)", plan.getvalue())
    memory = re.search(r"memory: .*", model.getvalue()).group(0)
    if tiles:
        assert f"out of core, C tiles of {tiles.group(1)} ({tiles.group(2)} a rank)" in memory
    else:
        assert "in memory" in memory and "in-memory" in plan.getvalue()
