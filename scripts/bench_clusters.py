"""Clusters brought up for the run, against clusters already running and against embedded engines.

Three network namespaces stand for three hosts, each with its own sshd (a: the head of each engine; b
and c: workers); the workdir is on an S3 server at the runner's address, and the hosts share no
filesystem with the runner. The multi-host test's pipeline (python -> Spark -> Dask -> Ray) runs, from
nothing (--force), --rounds times each way, interleaved:

    per-run   backends.<engine>.cluster over SSH: every cluster brought up for the run and taken down after
    attached  the same three clusters, brought up by the same launch commands before the run (untimed)
    embedded  local engines on the runner (what an engine's start costs here)

Prints each run's wall-clock seconds, each cluster's bring-up and take-down seconds in the per-run runs
(from their timelines), the median per-run / attached ratio, and what provisioning adds (per-run minus
attached) against the slowest engine's start in the embedded runs: the target is that it adds no more,
the clusters coming up side by side and beside the stages before theirs.

    python scripts/bench_clusters.py             # 3 rounds; needs root and openssh-server
    python scripts/bench_clusters.py --rounds 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hybridflow.api import load  # noqa: E402
from hybridflow.execution.sshclusters import launch_for, ssh_down, ssh_up  # noqa: E402
from hybridflow.reporting.clusterusage import cluster_usage  # noqa: E402
from hybridflow.reporting.timeline import ENGINE_START  # noqa: E402
from hybridflow.settings import ClusterSection  # noqa: E402
from hybridflow.store.workspace import Workspace  # noqa: E402
from tests.clusters.test_multihost import EMBEDDED, RAY_ENV, STAGES  # noqa: E402
from tests.support.netns import DRIVER_ADDRESS, Topology, netns_unavailable  # noqa: E402
from tests.support.projects import Project  # noqa: E402
from tests.support.s3server import S3Server  # noqa: E402
from tests.support.sshhosts import SSHD, start_sshd, three_host_cluster  # noqa: E402

ENGINES = ("spark", "dask", "ray")
STAGE_LINES = '''stages:
  make: {run: "mypkg.steps:make", outputs: [numbers]}
  squares: {run: "mypkg.steps:spark_square", backend: spark, inputs: [numbers], outputs: [squares]}
  totals: {run: "mypkg.steps:dask_total", backend: dask, inputs: [squares], outputs: [totals]}
  scaled: {run: "mypkg.steps:ray_scale", backend: ray, inputs: [totals], outputs: [scaled]}
'''
SPARK_CONF = "conf: {spark.executor.memory: 512m, spark.cores.max: 2, spark.sql.shuffle.partitions: 2}"


def write_pipelines(project: Project, bucket: str, sections: dict[str, dict], addresses: dict[str, str],
                    credentials: Path) -> None:
    """`credentials`: where the attached clusters' Dask certificates are (their other credentials are
    in the environment)."""
    import json

    head = f"workdir: s3://{bucket}/wd\nbackends:\n"
    per_run = "".join(f"  {e}:\n" + (f"    {SPARK_CONF}\n" if e == "spark" else "") +
                      f"    cluster: {json.dumps(sections[e])}\n" for e in ENGINES)
    tls = ", ".join(f"{name}: {credentials / f'dask-{name}.pem'}" for name in ("ca", "cert", "key"))
    attached = (f"  spark: {{master: \"{addresses['spark']}\", auth_secret: \"${{env:HF_BENCH_SPARK_SECRET}}\", "
                f"{SPARK_CONF}}}\n"
                f"  dask: {{address: \"{addresses['dask']}\", tls: {{{tls}}}}}\n"
                f"  ray: {{address: \"{addresses['ray']}\", auth_token: \"${{env:HF_BENCH_RAY_TOKEN}}\"}}\n")
    project.pipeline(f"name: perrun\n{head}{per_run}{STAGE_LINES}", "perrun.yaml")
    project.pipeline(f"name: attached\n{head}{attached}{STAGE_LINES}", "attached.yaml")
    project.pipeline(f"name: embedded\nworkdir: s3://{bucket}/wd\n{EMBEDDED}\n{STAGE_LINES}", "embedded.yaml")


def run(project: Project, name: str, env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", f"{name}.yaml", "--force"],
                          cwd=project.root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return seconds


def last_spans(project: Project, name: str) -> tuple[list[dict], list[dict]]:
    store = Workspace.of(load(project.root / f"{name}.yaml")).run_store()
    last = store.last_run(name)
    return store.spans(last["run_id"]), store.stages(last["run_id"])


def print_timeline(name: str, spans: list[dict]) -> None:
    """The run's spans, each as start and end in seconds from the run's first one."""
    zero = min(span["started_at"] for span in spans)
    print(f"  {name}:")
    for span in sorted(spans, key=lambda s: s["started_at"]):
        end = f"{span['ended_at'] - zero:6.1f}" if span["ended_at"] is not None else "     -"
        what = " ".join(filter(None, (span["kind"], span["stage"], span["detail"])))
        print(f"    {span['started_at'] - zero:6.1f} {end}  {what}")


def main() -> None:  # noqa: C901 - a benchmark's script, read top to bottom
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeline", action="store_true", help="print each run's timeline (seconds from its start)")
    args = parser.parse_args()
    reason = netns_unavailable() or (None if SSHD.exists() else "openssh-server is not installed")
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    scratch = Path(tempfile.mkdtemp(prefix="hf-bench-clusters-"))
    private = Path(tempfile.mkdtemp(prefix="hf-bench-private-"))  # hidden from the hosts
    hosts, s3, attached = Topology(), None, []
    try:
        hosts.build(["a", "b", "c"])
        key = start_sshd(hosts, scratch, hide=private)
        s3 = S3Server(scratch / "moto.log", host=DRIVER_ADDRESS).start()
        env = {**os.environ, **s3.env(), "HYBRIDFLOW_CACHE": str(private / "cache"), **RAY_ENV,
               "PYSPARK_PYTHON": sys.executable}
        os.environ.update(env)  # this process reads the runs' records from the store
        sections = {engine: three_host_cluster(hosts, key, engine) for engine in ENGINES}

        # the attached runs' clusters: the same launch commands, untethered; up before each attached run and
        # down after it, untimed (two Ray clusters on one host would contend for its fixed ports)
        specs = {engine: ClusterSection(**{**section, "env": {**section["env"], **{
            name: env[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}}})
            for engine, section in sections.items()}
        # how each is started and reached, with credentials made once and given to the attached pipeline
        launches = {engine: launch_for(engine, spec, f"hf-bench-attached-{engine}") for engine, spec in specs.items()}
        addresses = {engine: launch.address for engine, launch in launches.items()}
        for name, pem in (("ca", launches["dask"].attach["tls"].ca), ("cert", launches["dask"].attach["tls"].cert),
                          ("key", launches["dask"].attach["tls"].key)):
            (scratch / f"dask-{name}.pem").write_text(pem)
        env.update(HF_BENCH_SPARK_SECRET=launches["spark"].attach["auth_secret"],
                   HF_BENCH_RAY_TOKEN=launches["ray"].attach["auth_token"])

        def bring_up_attached() -> None:
            for engine, spec in specs.items():
                record = {"name": f"hf-bench-attached-{engine}", "run_id": "bench", "engine": engine}
                ssh_up(engine, spec, record, scratch / f"attached-{engine}.log", launch=launches[engine])
                attached.append((record, spec, scratch / f"attached-{engine}.log"))

        def take_down_attached() -> None:
            while attached:
                ssh_down(*attached.pop())

        project = Project(private / "flow")
        project.stages(STAGES)
        write_pipelines(project, s3.bucket("benchclusters"), sections, addresses, scratch)
        run(project, "embedded", env)  # warm-up: imports, the JVM's class data, the store's bucket
        times: dict[str, list[float]] = {"perrun": [], "attached": [], "embedded": []}
        ups: dict[str, list[float]] = {e: [] for e in ENGINES}
        downs: dict[str, list[float]] = {e: [] for e in ENGINES}
        starts: list[float] = []
        for number in range(1, args.rounds + 1):
            for name in times:
                if name == "attached":
                    bring_up_attached()
                times[name].append(run(project, name, env))
                if args.timeline:
                    print_timeline(name, last_spans(project, name)[0])
                if name == "attached":
                    take_down_attached()
            spans, stages = last_spans(project, "perrun")
            for usage in cluster_usage(spans, stages):
                ups[usage.engine].append(usage.up)
                downs[usage.engine].append(usage.down or 0.0)
            spans, _ = last_spans(project, "embedded")
            starts.append(max(s["ended_at"] - s["started_at"] for s in spans if s["kind"] == ENGINE_START))
            print(f"round {number}: " + ", ".join(f"{n} {t[-1]:.1f}s" for n, t in times.items()) +
                  f"; slowest embedded engine start {starts[-1]:.1f}s", flush=True)

        median = {name: statistics.median(t) for name, t in times.items()}
        print("\nper-run clusters, median of the rounds (bring up / take down):")
        for engine in ENGINES:
            print(f"  {engine:<6} {statistics.median(ups[engine]):6.1f}s / {statistics.median(downs[engine]):5.1f}s")
        extra, slowest = median["perrun"] - median["attached"], statistics.median(starts)
        print(f"\nrun, median: per-run {median['perrun']:.1f}s, attached {median['attached']:.1f}s, "
              f"embedded {median['embedded']:.1f}s")
        print(f"per-run / attached: {median['perrun'] / median['attached']:.2f}x")
        print(f"provisioning adds {extra:.1f}s; the slowest engine's start is {slowest:.1f}s: target "
              f"{'met' if extra <= slowest else 'NOT met'}")
    finally:
        for record, spec, log in attached:
            ssh_down(record, spec, log)
        if s3 is not None:
            s3.stop()
        hosts.remove()
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
