"""The scale benchmark (scripts/bench_scale.py) at its tiny size: the code path the 5M-50M runs take,
with every column of its report filled with sane values; and its ratios and targets on known numbers."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_scale.py"
MIB = 2**20


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_the_tiny_run_reports_every_column_with_sane_values(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--root", str(tmp_path), "--json", str(report)],
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr
    for column in ("etl s", "features s", "engine wait s", "s/M events", "own RSS MiB", "tree RSS MiB",
                   "median file MiB", "allowed", "x s/M events", "x tree RSS", "PASS"):
        assert column in done.stdout, (column, done.stdout)
    found = json.loads(report.read_text())
    [size] = found["sizes"]
    assert 30_000 < size["events"] < 80_000 and size["customers"] > 0
    assert set(size["stages"]) == {"etl", "features"}
    # engine_start is what each stage waited for its engine: 0 or more, since they start early
    assert all(s["seconds"] > 0 and s["engine_start"] >= 0 for s in size["stages"].values())
    assert size["work_s"] == pytest.approx(sum(s["seconds"] for s in size["stages"].values()))
    assert size["s_per_m_events"] == pytest.approx(size["work_s"] / size["events"] * 1e6)
    assert size["wall_s"] > size["work_s"]
    assert size["rss_samples"] > 5
    # hybridflow's own process is a Python (the command imports what it needs when it needs it: no
    # pyarrow or pandas before the run); the tree adds the run's process, a JVM and Dask workers
    assert 10 * MIB < size["own_peak_bytes"] < 1024 * MIB
    assert size["tree_peak_bytes"] > size["own_peak_bytes"] + 200 * MIB
    assert set(size["datasets"]) == {"customer_weeks", "etl_quality", "customer_features"}
    weeks = size["datasets"]["customer_weeks"]
    assert weeks["partitions"] == 13 and weeks["files"] >= 13 and weeks["median_file_bytes"] > 0
    assert all(d["allowed_files"] >= max(1, d["partitions"]) for d in size["datasets"].values())
    assert [q["s_per_m_events"] for q in found["ratios"]] == [1.0]
    assert len(found["targets"]) == 4 and all(isinstance(t["ok"], bool) for t in found["targets"])
    assert list(tmp_path.iterdir()) == [report]  # the scratch project is removed


def result(size_m, work_s, own_mib, tree_mib, files=1, partitions=1, mib=1.0):
    events = int(size_m * 1e6)
    return {"size_m": size_m, "events": events, "work_s": work_s, "s_per_m_events": work_s / size_m,
            "own_peak_bytes": own_mib * MIB, "tree_peak_bytes": tree_mib * MIB,
            "datasets": {"out": {"files": files, "partitions": partitions, "bytes": int(mib * MIB),
                                 "allowed_files": max(partitions, -(-int(mib * MIB) // (64 * MIB)))}}}


def test_ratios_are_to_the_smallest_size_and_targets_judge_the_extremes():
    bench = bench_module()
    results = [result(5, 50.0, 300, 4000), result(20, 220.0, 400, 9000), result(50, 600.0, 500, 15000)]
    assert [round(q["s_per_m_events"], 2) for q in bench.ratios(results)] == [1.0, 1.1, 1.2]
    assert [q["events"] for q in bench.ratios(results)] == [1.0, 4.0, 10.0]
    assert [t["ok"] for t in bench.targets(results)] == [True, True, True, True]

    slow_and_big = [result(5, 50.0, 300, 4000), result(50, 700.0, 1100, 17000, files=40, partitions=13, mib=1000)]
    checks = bench.targets(slow_and_big)
    assert [t["ok"] for t in checks] == [False, False, False, False]
    assert checks[0]["value"] == "1.40x"
    assert checks[3]["value"] == "1 over, worst out at 50M: 40 > 16"  # 1000 MiB allows 16 files of 64 MiB


def test_the_proc_reader_sees_the_same_tree_as_psutil():
    bench = bench_module()
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import time; print(\"ready\", flush=True); time.sleep(30)'])"], stdout=subprocess.PIPE)
    try:
        # the two readers look one after the other: the child must be done starting (its memory grows
        # while it imports), which waiting only for its fork did not ensure on a slow machine
        assert parent.stdout.readline() == b"ready\n", "the child never started"
        own, tree = bench.proc_tree_rss(parent.pid)
        expected_own, expected_tree = bench.tree_rss(parent.pid)
        assert own == pytest.approx(expected_own, rel=0.2) and tree == pytest.approx(expected_tree, rel=0.2)
        assert tree > own > 0
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()
        parent.stdout.close()
