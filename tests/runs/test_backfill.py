"""`hybridflow backfill`: chosen partitions of an incremental stage processed again, every other one
kept byte for byte, dependants rerun, chunks that commit on their own and resume after a kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.errors import ExitCode
from hybridflow.store.catalog import Catalog
from hybridflow.store.state import RunStore

STAGES = '''
import os
import signal
from pathlib import Path


def agg(raw, ctx):
    weeks = sorted(raw["week"].unique())
    ctx.log.info("called for %s", ",".join(weeks))
    if (Path(__file__).parent.parent / "KILL").exists() and "2026-01-19" in weeks:
        os.kill(os.getpid(), signal.SIGKILL)  # the run's process dies in the middle of a chunk
    if (Path(__file__).parent.parent / "FAIL").exists() and "2026-01-19" in weeks:
        raise ValueError("a bad delivery in 2026-01-19")
    return raw.groupby("week", as_index=False)["value"].sum().assign(run=ctx.run_id)


def total(per_week):
    return per_week.assign(all=per_week["value"].sum())[["all"]].head(1)
'''

PIPELINE = '''
name: deliveries
datasets:
  raw: {path: raw, partition_by: [week], schema: {week: string, value: int64}}
  per_week: {partition_by: [week]}
stages:
  agg: {run: "mypkg.steps:agg", incremental: true, inputs: [raw], outputs: [per_week]}
  total: {run: "mypkg.steps:total", inputs: [per_week], outputs: [totals]}
'''
WEEKS = ["2026-01-05", "2026-01-12", "2026-01-19", "2026-01-26", "2026-02-02"]


def deliver(project, week: str, values: list[int]) -> None:
    folder = project.root / "raw" / f"week={week}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"value": pa.array(values, pa.int64())}), folder / "part-0.parquet")


def hybridflow(project, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *map(str, args)], cwd=project.root,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "250"})


def delivered(project):
    project.stages(STAGES)
    project.pipeline(PIPELINE)
    for i, week in enumerate(WEEKS):
        deliver(project, week, list(range(i + 1)))
    done = hybridflow(project, "run", "pipeline.yaml")
    assert done.returncode == 0, done.stderr


def partitions(project) -> dict[str, bytes]:
    """week -> the bytes of its output partition's files, as published now."""
    version = Catalog(project.home("deliveries")).current("per_week")
    found: dict[str, bytes] = {}
    for file in sorted(version.files):
        week = file.parent.name.removeprefix("week=")
        found[week] = found.get(week, b"") + file.read_bytes()
    return found


def backfill_runs(project) -> list[dict]:
    runs = RunStore(project.root / ".hybridflow" / "runs.db").runs(limit=50)
    return [r for r in reversed(runs) if r["trigger"] == "backfill"]


def test_a_backfill_reprocesses_exactly_its_partitions_and_reruns_dependants(project):
    delivered(project)
    before = partitions(project)
    done = hybridflow(project, "backfill", "pipeline.yaml", "--partitions", "week=2026-01-12..2026-01-26")
    assert done.returncode == 0, done.stderr
    after = partitions(project)
    kept = [WEEKS[0], WEEKS[4]]
    assert {w: after[w] for w in kept} == {w: before[w] for w in kept}  # byte for byte
    assert all(after[w] != before[w] for w in WEEKS[1:4])  # new versions (their run column says by whom)
    [run] = backfill_runs(project)
    stages = {s["stage"]: s for s in RunStore(project.root / ".hybridflow" / "runs.db").stages(run["run_id"])}
    assert stages["agg"]["skip_reason"] == ("backfill of 3 partition(s) of raw (week=2026-01-12, week=2026-01-19, "
                                            "week=2026-01-26)")
    log = Path(stages["agg"]["log_path"]).read_text()
    assert "called for 2026-01-12,2026-01-19,2026-01-26" in log
    assert stages["total"]["status"] == "done"  # it depends on them
    again = hybridflow(project, "run", "pipeline.yaml")  # what the backfill left is current: nothing to do
    assert again.returncode == 0 and again.stdout.count("skipped") >= 2, again.stdout


def test_dry_run_lists_partitions_with_rows_and_an_empty_range_is_one_line(project):
    delivered(project)
    done = hybridflow(project, "backfill", "pipeline.yaml", "--partitions", "week=2026-01-12,2026-02-02",
                      "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "week=2026-01-12  2 rows" in done.stdout and "week=2026-02-02  5 rows" in done.stdout
    assert "processed again by: agg" in done.stdout and "then, as their inputs change: total" in done.stdout
    assert backfill_runs(project) == []
    empty = hybridflow(project, "backfill", "pipeline.yaml", "--partitions", "week=2027-01-01..2027-12-31",
                       "--dry-run")
    assert empty.returncode == ExitCode.DATA
    assert len(empty.stderr.strip().splitlines()) == 1 and "names no partition of raw" in empty.stderr


def test_chunks_commit_on_their_own_and_a_killed_backfill_resumes(project):
    delivered(project)
    before = partitions(project)
    (project.root / "KILL").touch()
    killed = hybridflow(project, "backfill", "pipeline.yaml", "--partitions", f"week={WEEKS[0]}..{WEEKS[4]}",
                        "--chunk", "2")
    assert killed.returncode != 0 and "resume with: hybridflow backfill pipeline.yaml --resume" in killed.stderr
    middle = partitions(project)
    assert all(middle[w] != before[w] for w in WEEKS[:2])  # chunk 1 committed
    assert all(middle[w] == before[w] for w in WEEKS[2:])  # chunk 2 died: nothing of it published
    (project.root / "KILL").unlink()
    resumed = hybridflow(project, "backfill", "pipeline.yaml", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "chunks 1 were done already" in resumed.stdout
    after = partitions(project)
    assert {w: after[w] for w in WEEKS[:2]} == {w: middle[w] for w in WEEKS[:2]}  # not redone
    assert all(after[w] != before[w] for w in WEEKS[2:])
    chunks = [(json.loads(r["calendar"])["chunk"], r["status"]) for r in backfill_runs(project)]
    assert chunks == [(1, "success"), (2, "killed"), (3 - 1, "success"), (3, "success")]
    listed = hybridflow(project, "runs", "pipeline.yaml")
    assert listed.stdout.count("chunk 2 of 3") >= 2, listed.stdout
    report = Path(hybridflow(project, "report").stdout.strip()).read_text()  # the last chunk's: a row each
    for number, status in ((1, "success"), (2, "success"), (3, "success")):
        assert f"<tr><td>{number}</td>" in report and status in report
    assert f"<td>{WEEKS[2]}, {WEEKS[3]}</td>" in report


def test_reprocess_missing_processes_only_partitions_never_processed(project):
    delivered(project)
    deliver(project, "2026-02-09", [7])  # a late delivery, in the range
    before = partitions(project)
    done = hybridflow(project, "backfill", "pipeline.yaml", "--partitions", "week=2026-01-26..2026-02-09",
                      "--reprocess", "missing")
    assert done.returncode == 0, done.stderr
    after = partitions(project)
    assert {w: after[w] for w in WEEKS} == {w: before[w] for w in WEEKS}
    assert "2026-02-09" in after


def test_reprocess_failed_processes_only_the_partitions_of_the_last_backfills_failed_chunks(project):
    delivered(project)
    before = partitions(project)
    (project.root / "FAIL").touch()
    asked = f"week={WEEKS[0]}..{WEEKS[4]}"
    failed = hybridflow(project, "backfill", "pipeline.yaml", "--partitions", asked, "--chunk", "2")
    assert failed.returncode != 0 and "a bad delivery in 2026-01-19" in failed.stderr, failed.stderr
    middle = partitions(project)
    assert all(middle[w] != before[w] for w in WEEKS[:2]) and all(middle[w] == before[w] for w in WEEKS[2:4])
    (project.root / "FAIL").unlink()
    assert [(json.loads(r["calendar"])["chunk"], r["status"]) for r in backfill_runs(project)] == \
        [(1, "success"), (2, "failed")]  # chunk 3 never ran
    again = hybridflow(project, "backfill", "pipeline.yaml", "--partitions", asked, "--reprocess", "failed")
    assert again.returncode == 0, again.stderr
    after = partitions(project)
    # the failed chunk's weeks and the one its failure kept from running, never the done chunk's
    assert [w for w in WEEKS if after[w] != middle[w]] == WEEKS[2:]
    assert backfill_runs(project)[-1]["status"] == "success"
