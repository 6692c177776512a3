"""A run's wall-clock timeline is recorded in runs.db (engine starts and stops; each attempt's input
read, function, publish and retry waits), and `hybridflow report` turns a run into one self-contained
HTML file: a timeline, every stage with why it ran or was skipped, and nothing fetched from elsewhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.store.state import RunStore

STAGES = '''
from pathlib import Path

import pandas as pd


def make():
    return pd.DataFrame({"x": [1, 2, 3]})


def flaky(made):
    marker = Path("tried")  # in the project directory, where the run was started
    if not marker.exists():  # fails on its first attempt only
        marker.write_text("once")
        raise RuntimeError("first attempt fails")
    return made.assign(y=made.x * 2)
'''

PIPELINE = '''
name: timed
stages:
  make: {run: "mypkg.steps:make", outputs: [made]}
  flaky: {run: "mypkg.steps:flaky", inputs: [made], outputs: [doubled], retries: 1, retry_delay: 0.2}
'''


def cli(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=project.root, capture_output=True,
                          text=True, timeout=120)


def test_the_timeline_is_recorded_and_reported_in_one_self_contained_file(project):
    project.stages(STAGES)
    project.pipeline(PIPELINE)
    assert cli(project, "run", "pipeline.yaml").returncode == 0
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    [run] = store.runs()
    spans = store.spans(run["run_id"])
    steps = [(s["stage"], s["kind"], s["attempt"], s["outcome"]) for s in spans if s["kind"] != "attempt"]
    assert ("flaky", "function", 1, "failed") in steps and ("flaky", "retry wait", 1, "ok") in steps
    assert ("flaky", "function", 2, "ok") in steps and ("flaky", "publish", 2, "ok") in steps
    assert ("make", "read inputs", 1, "ok") in steps
    assert all(s["ended_at"] >= s["started_at"] for s in spans)
    flaky = [s for s in spans if s["stage"] == "flaky"]
    assert min(s["started_at"] for s in flaky) >= max(s["ended_at"] for s in spans if s["stage"] == "make")

    assert cli(project, "run", "pipeline.yaml").returncode == 0  # every stage skipped this time
    shown = cli(project, "report", "--pipeline", "pipeline.yaml")
    assert shown.returncode == 0, shown.stderr
    path = project.root / shown.stdout.strip()
    html = path.read_text()
    assert html.startswith("<!DOCTYPE html>") and "Plotly.newPlot(\"timeline\"" in html
    assert "skipped" in html and "unchanged since run" in html  # why the second run skipped them
    assert offline(html)

    first = cli(project, "report", run["run_id"], "--pipeline", "pipeline.yaml", "--out", "first.html")
    assert first.returncode == 0, first.stderr
    html = (project.root / "first.html").read_text()
    timeline = figure(html, "timeline")
    bars = sum(len(trace["x"]) for trace in timeline["data"])
    assert bars == len(spans)  # a bar per recorded step
    names = {trace["name"] for trace in timeline["data"]}
    assert {"python stage", "read inputs", "function", "publish", "retry wait", "failed step"} <= names
    graph = figure(html, "graph")
    assert {"<b>make</b><br>python · done", "<b>flaky</b><br>python · done"} <= \
        {a["text"] for a in graph["layout"]["annotations"]}
    assert "first attempt fails" in html  # the tail of the stage's log
    assert "doubled" in html and "x: int64" in html and "made@" in html  # dataset, schema, lineage
    assert "never run; succeeded on attempt 2" in html and ">CPU<" in html  # why it ran, where
    assert (Path(run["run_dir"]) / "report.html").is_file()  # every run writes its own report
    assert "No earlier successful run" in html and "Compared with" in path.read_text()


def test_a_run_of_part_of_the_pipeline_still_draws_all_of_it(project):
    project.stages(STAGES)
    project.pipeline(PIPELINE)
    assert cli(project, "run", "pipeline.yaml", "--only", "make").returncode == 0
    html = (project.root / cli(project, "report", "--pipeline", "pipeline.yaml").stdout.strip()).read_text()
    texts = {a["text"] for a in figure(html, "graph")["layout"]["annotations"]}
    assert {"<b>make</b><br>python · done", "<b>flaky</b><br>not in this run", "<i>doubled</i>"} <= texts


def figure(html: str, element: str) -> dict:
    """The Plotly figure the report draws into `element`."""
    start = html.index(f'<div id="{element}"')
    spec = html[start:].split("const figure = ", 1)[1].split(";\nPlotly.newPlot", 1)[0]
    return json.loads(spec.replace("<\\/", "</"))


def offline(html: str) -> bool:
    """Nothing but Plotly's own bundle (which names the SVG namespace's URL and such) refers to another
    host, and no tag loads anything: every script and style is inline."""
    from plotly.offline import get_plotlyjs

    page = html.replace(get_plotlyjs(), "")
    return not any(reference in page for reference in ("http://", "https://", "<script src", "<link", "<img"))


MIXED = '''
from pathlib import Path

import pandas as pd


def make():
    return pd.DataFrame({"x": [1, 2, 3]})


def flaky(made):
    marker = Path("tried")  # each run's first attempt fails, its second succeeds
    if not marker.exists():
        marker.write_text("once")
        raise RuntimeError("the service timed out")
    marker.unlink()
    return made.assign(y=made.x * 2)


def broken(made):
    raise ValueError("no column named 'z'")


def after(checked):
    return checked


def summary(doubled):
    return doubled.head(1)
'''

MIXED_PIPELINE = '''
name: mixed
stages:
  make: {run: "mypkg.steps:make", outputs: [made]}
  flaky: {run: "mypkg.steps:flaky", inputs: [made], outputs: [doubled], retries: 1, retry_delay: 0.1}
  broken: {run: "mypkg.steps:broken", inputs: [made], outputs: [checked]}
  after: {run: "mypkg.steps:after", inputs: [checked], outputs: [final]}
  summary: {run: "mypkg.steps:summary", inputs: [doubled], outputs: [first_row]}
'''


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Two runs of a python-only pipeline (--keep-going): the second has a stage done on its second
    attempt (forced), skipped stages, a failed stage and one not run after it. Returns the project
    and the second run's report."""
    from tests.support.projects import Project

    project = Project(tmp_path_factory.mktemp("mixed"))
    project.stages(MIXED)
    project.pipeline(MIXED_PIPELINE)
    assert cli(project, "run", "pipeline.yaml", "--keep-going").returncode == 1
    assert cli(project, "run", "pipeline.yaml", "--keep-going", "--force", "flaky").returncode == 1
    return project, Path(cli(project, "report", "--pipeline", "pipeline.yaml").stdout.strip())


def test_a_failed_run_with_a_retry_and_skipped_stages_is_reported(mixed):
    project, path = mixed
    html = (project.root / path).read_text()
    assert offline(html)
    assert "no column named &#x27;z&#x27; (mypkg/steps.py:" in html  # the error and where it was raised
    assert "forced; succeeded on attempt 2" in html
    failed_row = html.split("<b>broken</b>", 1)[1].split("</tr>", 2)
    assert "<td>failed in run " in failed_row[0] and "no column named" in failed_row[1]  # why it ran, its error
    assert "upstream stage &#x27;broken&#x27; did not finish" in html or "an earlier stage failed" in html
    timeline = figure(html, "timeline")
    by_name = {trace["name"]: trace for trace in timeline["data"]}
    assert set(by_name["skipped"]["y"]) == {"make", "summary"}
    assert "unchanged since run" in by_name["skipped"]["text"][0]
    assert by_name["not run"]["y"] == ["after"]
    assert "broken" in by_name["failed attempt"]["y"] and "flaky" in by_name["failed attempt"]["y"]
    labels = dict(zip(timeline["layout"]["yaxis"]["tickvals"], timeline["layout"]["yaxis"]["ticktext"]))
    assert "failed" in labels["broken"] and "skipped" in labels["make"]
    graph = figure(html, "graph")
    boxes = {a["text"].split("<br>")[0]: a for a in graph["layout"]["annotations"] if a.get("bordercolor")}
    assert boxes["<b>broken</b>"]["bordercolor"] != boxes["<b>flaky</b>"]["bordercolor"]  # by status
    assert "<i>final</i>" in boxes and "<i>first_row</i>" in boxes  # outputs no stage reads
    assert "Compared with the previous successful run" in html and "No earlier successful run" in html


def test_an_incremental_run_says_which_partitions_it_processed(project):
    import pyarrow as pa
    import pyarrow.parquet as pq

    project.stages('''
def agg(raw):
    return raw.groupby("day", as_index=False)["value"].sum()
''')
    project.pipeline('''
    name: inc
    datasets:
      raw: {path: raw, partition_by: [day], schema: {day: string, value: int64}}
      per_day: {partition_by: [day]}
    stages:
      agg: {run: mypkg.steps:agg, incremental: true, inputs: [raw], outputs: [per_day]}
    ''')
    for day in ("d1", "d2", "d3"):
        folder = project.root / "raw" / f"day={day}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"value": pa.array([1, 2], pa.int64())}), folder / "part-0.parquet")
        assert cli(project, "run", "pipeline.yaml").returncode == 0
    html = (project.root / cli(project, "report", "--pipeline", "pipeline.yaml").stdout.strip()).read_text()
    assert "1 of 3 partitions of raw new or changed (day=d3)" in html
    assert "<i>raw</i>" in {a["text"] for a in figure(html, "graph")["layout"]["annotations"]}  # an external input
    rows = html.split("Compared with the previous successful run", 1)[1]
    assert "<td>2</td><td>3</td><td>+50%</td>" in rows  # rows out then and now


EARLY = '''
import os
from pathlib import Path

import pandas as pd


def on_dask():
    import dask.dataframe as dd

    return dd.from_pandas(pd.DataFrame({"x": [1, 2]}), npartitions=1)


def afterwards(made):
    me = str(os.getpid())
    workers = []
    for entry in Path("/proc").glob("[0-9]*"):  # Dask's worker processes are this process's children
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == me and \\
                    b"spawn_main" in (entry / "cmdline").read_bytes():
                workers.append(entry.name)
        except (OSError, IndexError):
            continue
    return made.assign(workers_alive=len(workers))
'''


def test_an_engine_no_later_stage_needs_is_stopped_before_the_next_stage(project):
    project.stages(EARLY)
    project.pipeline('''
    name: early
    backends: {dask: {n_workers: 1, threads_per_worker: 1}}
    stages:
      made: {run: "mypkg.steps:on_dask", backend: dask, outputs: [made]}
      after: {run: "mypkg.steps:afterwards", inputs: [made], outputs: [checked]}
    ''')
    assert cli(project, "run", "pipeline.yaml").returncode == 0
    import pyarrow.parquet as pq

    from hybridflow.store.catalog import Catalog

    checked = Catalog(project.home("early")).current("checked")
    assert pq.read_table([str(f) for f in checked.files])["workers_alive"].to_pylist() == [0, 0]
    store = RunStore(project.root / ".hybridflow" / "runs.db")
    [run] = store.runs()
    spans = store.spans(run["run_id"])
    stopped = [s for s in spans if s["kind"] == "engine stop" and s["detail"] == "dask"]
    called = [s for s in spans if s["kind"] == "function" and s["stage"] == "after"]
    assert stopped and called and stopped[0]["ended_at"] <= called[0]["started_at"]


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# a fresh profile, none of the browser's own background traffic, and a proxy on a closed port: a
# request the page made would fail there, and the network log names it either way
BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--proxy-server=127.0.0.1:9", "--virtual-time-budget=8000")


def browse(page: Path, tmp: Path, *action: str) -> tuple[str, list[str]]:
    """Open `page` in headless Chromium; (its stdout, the URLs the page itself asked for)."""
    net = tmp / f"{page.stem}-net.json"
    done = subprocess.run([BROWSER, *BROWSER_FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--log-net-log={net}",
                           *action, page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    log = json.loads(net.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    requested = [e["params"]["url"] for e in log["events"] if e["type"] == start_job
                 and str(e["params"].get("network_isolation_key", "")).startswith("file://")]  # the page's own
    return done.stdout, requested


@pytest.mark.skipif(BROWSER is None, reason="Chromium is not installed (apt-get install chromium; .ci/run does)")
def test_the_report_draws_its_timeline_and_graph_in_a_real_browser_offline(mixed, tmp_path):
    project, path = mixed
    page = project.root / path
    dom, requested = browse(page, tmp_path, "--dump-dom")
    assert requested == []  # nothing fetched from the network: no script, style, font or image
    timeline = dom.split('id="timeline"', 1)[1].split('id="graph"', 1)[0]
    graph = dom.split('id="graph"', 1)[1]
    assert 'class="main-svg"' in timeline and 'class="main-svg"' in graph  # Plotly drew both
    spans = RunStore(project.root / ".hybridflow" / "runs.db").spans(path.parent.name)
    skipped_or_not_run = 3  # make and summary skipped, after not run
    assert timeline.count('class="point"') == len(spans) + skipped_or_not_run  # a bar for each
    assert all(f">{stage}<" in graph for stage in ("make", "flaky", "broken", "after", "summary"))
    assert "unchanged since run" in timeline  # a skipped stage's bar says why

    shot = tmp_path / "report.png"
    browse(page, tmp_path, "--window-size=1400,1800", f"--screenshot={shot}")
    from PIL import Image

    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200  # drawn, not a blank page

    # the check itself: a page that loads a script from elsewhere is caught
    elsewhere = tmp_path / "elsewhere.html"
    elsewhere.write_text('<html><body><script src="http://127.0.0.1:9/plotly.js"></script></body></html>')
    assert browse(elsewhere, tmp_path, "--dump-dom")[1] == ["http://127.0.0.1:9/plotly.js"]


def test_the_graph_layout_bends_long_arrows_around_boxes_and_turns_when_deep():
    from hybridflow.reporting.reportcharts import _layered, pipeline_graph

    a, b, c = ("stage", "a"), ("stage", "b"), ("stage", "c")
    position, routes = _layered([a, b, c], [(a, b), (b, c), (a, c)])
    assert [position[n][0] for n in (a, b, c)] == [0, 1, 2] and routes[(a, b)] == []
    [via] = routes[(a, c)]
    assert position[via][0] == 1 and position[via] != position[b]  # its own place in b's layer

    def stage(name: str) -> dict:
        return {"stage": name, "backend": "python", "status": "done"}

    chain = [f"s{i}" for i in range(8)]
    writes = [(name, f"d{i}") for i, name in enumerate(chain)]
    reads = [(f"d{i}", name) for i, name in enumerate(chain[1:])]
    deep = pipeline_graph([stage(n) for n in chain], reads, writes, {})
    assert deep["layout"]["height"] > deep["layout"]["width"]  # eight stages: top to bottom
    short = pipeline_graph([stage(n) for n in chain[:3]], reads[:2], writes[:3], {})
    assert short["layout"]["width"] > short["layout"]["height"]  # three: left to right
