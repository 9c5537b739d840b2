"""The model's time of a plan (:mod:`summa.planning.prediction`), as ``summa
plan`` prints it and ``--json`` records it: the time split into its parts,
combined as documented, the bound and what would move it, on the profiles
shipped with summa."""

import io
import json
import re
import types

import pytest
from mpi4py import MPI

from summa import cli
from summa.distribution.layout import first_panel_width
from summa.planning.memory import (FP64_INT8_TAIL_SMALLEST, HEAD_FIRST, TAIL_SMALLEST,
                                   host_traffic, parse_bytes)
from summa.planning.profile import Profile
from summa.planning.planner import FREE_SHARE
from summa.planning.prediction import NEXT_BOUND_SHARE
from summa.planning.report import NEAR_RUNNER


def _plan(tmp_path, args) -> tuple[str, dict]:
    """``summa plan ARGS --json FILE``: what it printed, and the plan it wrote."""
    path, out = tmp_path / "plan.json", io.StringIO()
    path.unlink(missing_ok=True)
    assert cli.main(["plan", *args, "--json", str(path)], MPI.COMM_SELF, out) == 0
    return out.getvalue(), json.loads(path.read_text())


def _profile(name: str) -> dict:
    from summa.planning.profile import hardware_profile
    return json.loads(open(hardware_profile(name)).read())


#: Printed names of a time split's parts (``summa plan``).
PRINTED = {"gemm": "GEMMs", "host_link": "host link", "host_memory": "host memory",
           "gpu_links": "GPU links", "exposed": "exposed", "disk": "disk"}
#: The parts as the bound and the parts beside it are named.
BOUND_NAMES = {"gemm": "GEMMs", "host_link": "host link", "host_memory": "node's host memory",
               "gpu_links": "GPU links"}
COUNTED = tuple(BOUND_NAMES)
FIRST_USER = ["--size", "100000", "--grid", "2x4", "--hardware", "rtx3090x8"]


@pytest.mark.parametrize("args", [
    FIRST_USER, FIRST_USER + ["--precision", "fp64-int8"],
    FIRST_USER + ["--device-memory", "8GiB"],
    ["--size", "100000", "--grid", "2x1"],                             # H200s, in memory
    ["--size", "32768", "--ranks", "1", "--device-memory", "8GiB"],     # one H200, out of core
    ["--size", "65536", "--grid", "2x1", "--dtype", "float32", "--hardware", "rtx3090x8"],
    ["--m", "4096", "--n", "4096", "--k", "400000", "--grid", "1x2", "--nb", "256"],
    ["--m", "2048", "--n", "2048", "--k", "1000000", "--grid", "2x4", "--dtype", "float32",
     "--hardware", "rtx3090x8"],                                       # broadcasts over PCIe
])
def test_the_time_split_combines_to_the_time_and_the_bound_is_its_largest_part(tmp_path, args):
    """The printed time is the split's parts combined as documented: the
    largest of those that overlap, plus the others counted, plus the
    exposed rest (the disk beside it, not in it); every part is printed as
    --json records it, and the bound named is the largest part, with its
    share of the time and the next largest part beside it."""
    text, plan = _plan(tmp_path, args)
    pred = plan["predicted"]
    split = pred["split"]
    counted = {p: split[p] for p in COUNTED if split[p] is not None}
    at_once = max(v for p, v in counted.items() if p in split["overlapped"])
    # the link's and the host memory's side of one set of copies: the longer of them
    copies = max((v for p, v in counted.items() if p not in split["overlapped"]
                  and p in ("host_link", "host_memory")), default=0.0)
    serial = sum(v for p, v in counted.items() if p not in split["overlapped"]
                 and p not in ("host_link", "host_memory"))
    assert split["exposed"] >= 0
    assert at_once + copies + serial + split["exposed"] == \
        pytest.approx(pred["seconds"], rel=1e-12)
    if not plan["out_of_core"]:  # the SUMMA's part is the model's time (summa model)
        assert max(split["gemm"], split["gpu_links"]) + split["exposed"] == \
            pytest.approx(pred["summa_seconds"], rel=1e-12)
    assert float(re.search(r"predicted by the model: ([\d.]+) s", text).group(1)) == \
        pytest.approx(pred["seconds"], abs=0.005)
    for part, name in PRINTED.items():
        row = re.search(rf"^    {name} +([\d.]+ s|not counted)  ", text, re.M)
        assert row, (name, text)
        if split[part] is None:
            assert row.group(1) == "not counted"
        else:
            assert float(row.group(1)[:-2]) == pytest.approx(split[part], abs=0.005)
    bound = max(counted, key=counted.get)
    assert pred["bound"] == bound
    assert pred["bound_share"] == pytest.approx(counted[bound] / pred["seconds"])
    named = re.search(r"bound by: the ([A-Za-z' ]+?)(?: \(.*?\))?, (\d+) % of the time; "
                      r"the ([A-Za-z' ]+?)(?: \([^)]*\))? would take ([\d.]+) s(.*)", text)
    assert named, text
    assert named.group(1) == BOUND_NAMES[bound] and int(named.group(2)) == round(
        100 * pred["bound_share"])
    runner_up = max((p for p in counted if p != bound), key=counted.get)
    assert named.group(3) == BOUND_NAMES[runner_up]
    assert float(named.group(4)) == pytest.approx(counted[runner_up], abs=0.05)
    # beside it, the parts near it (NEAR_RUNNER), each with its time
    near = {p for p in counted if p not in (bound, runner_up)
            and counted[p] >= NEAR_RUNNER * counted[runner_up]}
    beside = dict(re.findall(r", the ([A-Za-z' ]+?)(?: \([^)]*\))? ([\d.]+) s", named.group(5)))
    assert set(beside) == {BOUND_NAMES[p] for p in near}
    for p in near:
        assert float(beside[BOUND_NAMES[p]]) == pytest.approx(counted[p], abs=0.05)
    assert re.search(r"would move it: \S", text)
    # a part at least NEXT_BOUND_SHARE of the bound's is named next, with its own advice
    close = counted[runner_up] >= NEXT_BOUND_SHARE * counted[bound]
    assert pred["next"] == (runner_up if close else None)
    assert bool(re.search(rf"next bound, the {BOUND_NAMES[runner_up]}.* at [\d.]+ s: \S",
                          text)) == close


def test_on_the_first_users_gpus_the_bound_follows_the_profile(tmp_path):
    """Eight RTX 3090s (24 GB, PCIe, no peer access): the GEMMs take what
    the profile's rate says, the host link what the plan's tiles move at
    its host_link rates (each GPU uploads all it needs: nothing between
    GPUs), so float64 is bound by its GEMMs, the plan says fp64-int8 would
    move that, and with fp64-int8 the bound moves: a smaller part bounds
    the run, whichever the profile's figures make it."""
    profile, data = Profile.load(_hardware("rtx3090x8")), _profile("rtx3090x8")
    link = data["host_link"]
    bounds = {}
    for precision in (None, "fp64-int8"):
        text, plan = _plan(tmp_path, FIRST_USER + (["--precision", precision] if precision
                                                   else []))
        pred, memory = plan["predicted"], plan["memory"]
        assert plan["out_of_core"]  # the profile's 24 GB per GPU do not hold it
        (m, n, k), ranks = plan["shape"], plan["ranks"]
        tile, nb = memory["tile"], plan["panel_width"]
        gemm = 2 * m * n * k / ranks / profile.gemm_rate(*tile, nb, "float64", precision)
        assert pred["split"]["gemm"] == pytest.approx(gemm, rel=nb / k)  # whole last panel
        moved = host_traffic(types.SimpleNamespace(tiles=memory["tiles"]), (m, n, k),
                             plan["grid"]) * 8
        block_c = 8 * -(-m // plan["grid"][0]) * -(-n // plan["grid"][1])
        assert sum(pred["host_bytes"]) == moved and pred["host_bytes"][1] == block_c
        assert pred["split"]["host_link"] == pytest.approx(
            (moved - block_c) / (link["h2d_gbs"] * 1e9) + block_c / (link["d2h_gbs"] * 1e9))
        assert pred["split"]["gpu_links"] == 0 and "without peer access" in text
        # exposed: what no GEMM hides, the first upload and the last write-back (the
        # profile has no per-panel overhead)
        first = first_panel_width(k, nb) if precision else HEAD_FIRST  # whole: the narrowest
        last = FP64_INT8_TAIL_SMALLEST if precision else TAIL_SMALLEST
        assert profile.panel_overhead(ranks) == 0
        # whole and narrower than a panel, the first GEMM hides only its share of
        # the second panel's upload
        behind = max(0.0, 8 * nb * sum(tile) / (link["h2d_gbs"] * 1e9)
                     - pred["split"]["gemm"] / (memory["tiles"][0] * memory["tiles"][1])
                     * first / k) \
            if precision and first < nb else 0.0
        assert pred["split"]["exposed"] == pytest.approx(
            8 * first * sum(tile) / (link["h2d_gbs"] * 1e9)
            + 8 * last * tile[1] / (link["d2h_gbs"] * 1e9) + behind)
        expected = max(("gemm", gemm), ("host_link", pred["split"]["host_link"]),
                       key=lambda part: part[1])
        assert pred["bound"] == expected[0]
        bounds[precision] = expected
        if precision is None:
            assert "would move it: --precision fp64-int8" in text
    assert bounds[None][0] == "gemm"
    assert bounds["fp64-int8"][1] < bounds[None][1]  # the bound moved
    assert re.search(r"disk +not counted  the profile has no disk rate", text)


def _hardware(name: str) -> str:
    from summa.planning.profile import hardware_profile
    return hardware_profile(name)


def test_plans_take_the_profiles_device_memory_and_host_link(tmp_path):
    """Without --device-memory a plan for named hardware takes its GPUs'
    memory (FREE_SHARE of it out of core) and says so; --device-memory caps
    it; CPU ranks have none. In memory from host arrays the operands go up
    once and C comes down once, before and after the SUMMA; the disk, where
    the profile has its rates, is timed beside."""
    data = _profile("rtx3090x8")
    text, plan = _plan(tmp_path, FIRST_USER)
    assert plan["device_budget"] == int(data["device_memory"] * FREE_SHARE)
    assert f"; {data['device_memory'] / 2**30:.1f} GiB a GPU" in text.splitlines()[0]
    _, capped = _plan(tmp_path, FIRST_USER + ["--device-memory", "12GiB"])
    assert capped["device_budget"] == parse_bytes("12GiB")
    _, cpu = _plan(tmp_path, FIRST_USER + ["--backend", "numpy"])
    assert not cpu["out_of_core"] and cpu["predicted"]["split"]["host_link"] == 0
    h200 = _profile("h200")
    text, plan = _plan(tmp_path, ["--size", "100000", "--grid", "2x1"])
    assert not plan["out_of_core"]  # 119 GiB a rank fit an H200
    pred, (m, n, k), (pr, pc) = plan["predicted"], plan["shape"], plan["grid"]
    up = 8 * (-(-m // pr) * -(-k // pc) + -(-k // pr) * -(-n // pc))
    down = 8 * -(-m // pr) * -(-n // pc)
    assert pred["host_bytes"] == [up, down]
    link = h200["host_link"]
    assert pred["split"]["host_link"] == pytest.approx(up / (link["h2d_gbs"] * 1e9)
                                                       + down / (link["d2h_gbs"] * 1e9))
    assert pred["split"]["overlapped"] == ["gemm", "gpu_links"]
    disk = h200["disk"]
    assert pred["split"]["disk"] == pytest.approx(16 * m * k / (disk["read_gbs"] * 1e9)
                                                  + 8 * m * n / (disk["write_gbs"] * 1e9))
    bare = tmp_path / "no-link.json"
    bare.write_text(json.dumps({key: value for key, value in data.items()
                                if key != "host_link"}))
    text, plan = _plan(tmp_path, ["--size", "100000", "--grid", "2x4", "--profile", str(bare)])
    assert plan["predicted"]["split"]["host_link"] is None
    assert re.search(r"host link +not counted  the profile has no host_link rates", text)


def test_a_sweep_of_tiny_steps_is_predicted_at_its_steps_cost(tmp_path):
    """Out of core on a GPU the host issues every step (C tile x panel) and
    every tile: 8192³ under 16 MiB, thousands of tiny tiles, is predicted at
    no less than their cost (an H200 took 76.5 s) and the plan says so;
    32768³ under 8 GiB, a few large steps, is not moved by it."""
    from summa.planning.prediction import SWEEP_STEP_SECONDS, SWEEP_TILE_SECONDS
    text, plan = _plan(tmp_path, ["--size", "8192", "--ranks", "1", "--device-memory", "16MiB"])
    rows, cols = plan["memory"]["tiles"]
    steps = rows * cols * -(-8192 // plan["memory"]["chunk"])
    assert plan["predicted"]["steps"] == steps > 10000
    floor = steps * SWEEP_STEP_SECONDS + rows * cols * SWEEP_TILE_SECONDS
    assert plan["predicted"]["steps_seconds"] == pytest.approx(floor)
    assert plan["predicted"]["seconds"] >= floor * (1 - 1e-9)
    assert f"the sweep's {steps} steps over {rows * cols} C tiles" in text
    text, plan = _plan(tmp_path, ["--size", "32768", "--ranks", "1", "--device-memory", "8GiB"])
    split = plan["predicted"]["split"]
    assert plan["predicted"]["steps_seconds"] < 0.1 * split["gemm"]
    assert "steps over" not in text


def test_a_sweep_of_one_panel_tiles_is_predicted_at_its_tiles_cost(tmp_path):
    """A tile costs the host more than a step: 16384² x 2048 under 64 MiB
    cuts 1278 tiles of one panel each (an H200 took 5.9 s, where the host
    link alone takes ~1.9 s and the steps alone at their cost ~2 s); the
    prediction holds the tiles' cost, within the measured run's."""
    text, plan = _plan(tmp_path, ["--m", "16384", "--n", "16384", "--k", "2048",
                                  "--ranks", "1", "--device-memory", "64MiB"])
    rows, cols = plan["memory"]["tiles"]
    assert plan["predicted"]["steps"] == rows * cols > 1000
    assert 4.5 < plan["predicted"]["seconds"] < 7.5


def _flat_host_memory(tmp_path, nodes: int, gbs: float = 100.0, estimate=True) -> str:
    """The rtx3090x8 profile with a node memcpy rate of `gbs` whatever the
    copiers, its 8 GPUs on `nodes` nodes; the file's path."""
    data = _profile("rtx3090x8")
    data.update(nodes=nodes, host_memory={"copy_gbs": [[1, gbs]], "cores": 64,
                                          "estimate": estimate})
    path = tmp_path / f"flat-{nodes}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_the_node_host_memory_is_shared_by_its_ranks(tmp_path):
    """Every rank's staged bytes pass through its node's memory (a memcpy
    into a page-locked chunk and the DMA's read: four bytes of traffic
    each, and C's new pages once): the same 8 GPUs, 8 on one node, take
    twice the host memory time of 4 on each of two nodes, while the host
    link, per GPU, stays; the row says what it moves and at what rate, and
    an estimate is said to be one."""
    from summa.planning.profile import MEMCPY_TRAFFIC
    split, texts = {}, {}
    for nodes in (1, 2):
        texts[nodes], plan = _plan(tmp_path, FIRST_USER[:4] + ["--profile",
                                                              _flat_host_memory(tmp_path, nodes)])
        pred = plan["predicted"]
        up, down = pred["host_bytes"]
        ranks = 8 // nodes
        traffic = ranks * (4 * (up + down) + down)
        assert pred["host_memory"]["traffic"] == traffic
        assert pred["split"]["host_memory"] == pytest.approx(traffic / (MEMCPY_TRAFFIC * 100e9))
        split[nodes] = pred["split"]
        # the copy threads share the profile's node's 64 cores, not this host's
        assert plan["copy_threads"] == min(12, 64 * 3 // 4 // ranks)
        assert pred["host_memory"]["copiers"] == ranks * plan["copy_threads"]
    assert split[1]["host_memory"] == pytest.approx(2 * split[2]["host_memory"])
    assert split[1]["host_link"] == split[2]["host_link"]
    row = re.search(r"^    host memory +([\d.]+) s  8 GPUs a node: (\d+) GB read and written at "
                    r"300 GB/s \(memcpy 100 GB/s on \d+ threads; an estimate\)$", texts[1], re.M)
    assert row and float(row.group(1)) == pytest.approx(split[1]["host_memory"], abs=0.005)
    # out of core the copies overlap the GEMMs: the largest part is the time
    assert "max(GEMMs, host link, host memory, GPU links)" in texts[1]


@pytest.mark.parametrize("measured, ranks, counted", [(1, 1, False), (8, 8, False),
                                                       (4, 8, True), (None, 1, True)])
def test_a_link_measured_with_as_many_gpus_copying_holds_the_host_memory(tmp_path, measured,
                                                                        ranks, counted):
    """Where the host link's rates were measured (summa calibrate) with at
    least as many of a node's GPUs copying at once as the plan puts on a
    node, its staged copies ran through the node's memory: the host memory
    row says it is in the link's rates and is not counted beside it; with
    more GPUs a node than measured, or a link that does not say, it is."""
    path = _flat_host_memory(tmp_path, 1, gbs=10.0, estimate=False)
    data = json.loads(open(path).read())
    if measured is not None:
        data["host_link"]["gpus"] = measured
    open(path, "w").write(json.dumps(data))
    args = (FIRST_USER[:2] + ["--grid", "2x4"] if ranks == 8 else
            ["--size", "40000", "--ranks", "1", "--device-memory", "8GiB"])
    text, plan = _plan(tmp_path, args + ["--precision", "fp64-int8", "--profile", path])
    pred = plan["predicted"]
    row = re.search(r"^    host memory +(.*)$", text, re.M).group(1)
    link = pred["split"]["host_link"]
    if counted:
        assert pred["split"]["host_memory"] > link and pred["bound"] == "host_memory"
        assert row.startswith(f"{pred['split']['host_memory']:.2f} s  {ranks} GPU")
    else:
        assert pred["split"]["host_memory"] is None and pred["bound"] != "host_memory"
        assert pred["host_memory"]["in_link"] == measured
        assert row.startswith(f"not counted  in the host link's rates, measured with "
                              f"{measured} GPU")
        assert pred["seconds"] < pred["host_memory"]["traffic"] / (3 * 10e9)


def test_a_host_memory_bound_is_named_with_what_would_move_it(tmp_path):
    """A node whose memory copies slowly bounds the run: the plan names it,
    its rate, and what would move it (fewer bytes, page-locked operands,
    fewer GPUs a node); a measured rate is not called an estimate."""
    path = _flat_host_memory(tmp_path, 1, gbs=10.0, estimate=False)
    text, plan = _plan(tmp_path, FIRST_USER[:4] + ["--precision", "fp64-int8", "--profile", path])
    pred = plan["predicted"]
    assert pred["bound"] == "host_memory"
    assert pred["seconds"] >= pred["split"]["host_memory"]
    assert re.search(r"bound by: the node's host memory \(10 GB/s of memcpy\), \d+ % of the "
                     r"time", text)
    assert "an estimate" not in text.split("where the time goes")[1].split("combined")[0]
    advice = " ".join(pred["advice"])
    assert "fewer C tiles" in advice and "page-locked" in advice and "fewer GPUs a node" in advice


def test_the_first_users_plan_names_the_host_memory_estimate(tmp_path):
    """rtx3090x8 fp64-int8: its host memory figure is an estimate (the
    profile says so), counted, and named in the bound's line with it."""
    data = _profile("rtx3090x8")
    assert data["host_memory"]["estimate"] is True and data["host_memory"]["note"]
    text, plan = _plan(tmp_path, FIRST_USER + ["--precision", "fp64-int8"])
    assert plan["predicted"]["split"]["host_memory"] > 0
    bound_line = next(x for x in text.splitlines() if x.startswith("  bound by:"))
    assert re.search(r"the node's host memory \([\d.]+ GB/s of memcpy, an estimate\)",
                     bound_line)
