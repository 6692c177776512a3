"""Clusters brought up for one run and taken down after it: an engine whose `backends.<engine>.cluster`
section says how is attached to the cluster brought up for it, and the cluster is taken down as soon
as no remaining stage needs the engine, at the run's end, on failure, on a stop request and on a
timeout (see enginepool).

What in-process teardown cannot survive (a kill -9, an OOM kill) the workdir records: each cluster is
recorded there before it is brought up and the record removed once it is down, and every run starts
by taking down the clusters recorded by runs that are no longer alive (`hybridflow clusters reap`
does the same on demand). Under the pipeline's lock no other run is alive, so every record found
then belongs to a dead one.

Two providers say how:
- `ssh`: the engine's own cluster processes (a Dask scheduler and workers, a Spark master and workers,
  a Ray head and nodes: the engine plugin's cluster_launch says which) started on the team's hosts
  over SSH, each bound to its host's address, in a session of its own, with its output to
  /tmp/hybridflow-clusters/<name>-<role>.log there and HYBRIDFLOW_CLUSTER_NAME in its environment.
  Taking it down ends every process on each host whose environment carries the cluster's name (what
  the launched processes started too), and brings their logs into the run's cluster-<engine>.log.
  The script each host runs is sent on SSH's input: `env:` values (credentials) are on no command line.
- `command`: the team's own `up` and `down` commands, which is how Terraform, `kubectl apply`, `ray
  up` or a cloud CLI plug in.

Commands run with bash in the pipeline's folder, in a session of their own, with these variables:
    HYBRIDFLOW_CLUSTER_NAME  hf-<pipeline>-<run>-<engine>: a name to tag what they start with (every
                             process started here inherits it, and hybridflow leaves those running)
    HYBRIDFLOW_RUN_ID, HYBRIDFLOW_PIPELINE, HYBRIDFLOW_ENGINE
    HYBRIDFLOW_CLUSTER       (down and status) the JSON object `up` printed
`up` prints the cluster as a JSON object on its last line of output: {"address": "tcp://10.0.0.5:8786",
...anything down needs}. Its output and the other commands' go to the run's cluster-<engine>.log.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .errors import UnavailableError, first_line

log = logging.getLogger("hybridflow")
TAG = "HYBRIDFLOW_CLUSTER_NAME"


@dataclass
class Outcome:
    returncode: int | None  # None: killed at its timeout
    output: str


@dataclass
class RunClusters:
    """The clusters of one run, by engine."""

    pipeline: Any  # a pipeline.Pipeline
    run_id: str
    log_dir: Path
    records: Any  # clusterrecords.LocalRecords or ObjectRecords
    up_clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # teardowns that failed: said at the run's end
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def bring_up(self, engine: str, spec) -> str:
        """Bring `engine`'s cluster up as `spec` (a settings.CommandCluster) says; its address. Recorded
        in the workdir first; a failed `up` is followed by `down`, so nothing is left behind."""
        key = f"{self.run_id}-{engine}"
        record = {"run_id": self.run_id, "pipeline": self.pipeline.name, "engine": engine, "provider": spec.provider,
                  "name": cluster_name(self.pipeline.name, self.run_id, engine), "state": "starting",
                  "runner": {"host": socket.gethostname(), "pid": os.getpid()}, "created_at": _now()}
        self.records.put(key, record)
        with self._lock:
            self.up_clusters[engine] = record
        try:
            if spec.provider == "ssh":
                cluster = ssh_up(engine, spec, record, self._log(engine))
            else:
                outcome = run_command(spec.up, cluster_env(record), spec.up_timeout, self._log(engine), "up",
                                      self.pipeline.root)
                cluster = parsed_cluster(engine, outcome, spec.up_timeout, self._log(engine))
        except BaseException:  # a failed `up`, a timeout, a stop request: whatever it got as far as making
            self.take_down(engine, spec)
            raise
        record.update(state="up", cluster=cluster, up_at=_now())
        # this run's `down` gets what `up` printed; the record, which outlives the run, no ${env:...} value
        self.records.put(key, {**record, "cluster": json.loads(self.pipeline.redact(json.dumps(cluster)))})
        return cluster["address"]

    def take_down(self, engine: str, spec) -> None:
        """Run `down` for the engine's cluster (bounded by its timeout). Done: the record goes. Failed or
        hung: the record stays, for the next run or `hybridflow clusters reap`, and the run says so."""
        with self._lock:
            record = self.up_clusters.pop(engine, None)
        if record is None:
            return
        problem = tear_down(record, spec, self._log(engine), self.pipeline.root, self.records)
        if problem:
            self.problems.append(problem)

    def _log(self, engine: str) -> Path:
        return self.log_dir / f"cluster-{engine}.log"


def cluster_name(pipeline: str, run_id: str, engine: str) -> str:
    return f"hf-{pipeline}-{run_id}-{engine}"


def cluster_env(record: dict[str, Any]) -> dict[str, str]:
    env = {TAG: record["name"], "HYBRIDFLOW_RUN_ID": record["run_id"], "HYBRIDFLOW_PIPELINE": record["pipeline"],
           "HYBRIDFLOW_ENGINE": record["engine"]}
    if "cluster" in record:
        env["HYBRIDFLOW_CLUSTER"] = json.dumps(record["cluster"])
    return env


def tear_down(record: dict[str, Any], spec, log_file: Path, cwd: Path, records) -> str | None:
    """`down` for a recorded cluster; None when it is down (and its record removed), else what went wrong."""
    key = f"{record['run_id']}-{record['engine']}"
    if spec.provider == "ssh":
        problem = ssh_down(record, spec, log_file)
        if problem is None:
            records.delete(key)
        else:
            record.update(state="down failed", down_failed_at=_now())
            records.put(key, record)
        return problem
    outcome = run_command(spec.down, cluster_env(record), spec.down_timeout, log_file, "down", cwd)
    if outcome.returncode == 0:
        records.delete(key)
        return None
    record.update(state="down failed", down_failed_at=_now())
    records.put(key, record)
    if outcome.returncode is None:
        return (f"the {record['engine']} cluster of run {record['run_id']}: `down` did not finish within "
                f"{spec.down_timeout:g} s and was killed; the cluster may still be up (see {log_file}; "
                f"hybridflow clusters reap tries again)")
    return (f"the {record['engine']} cluster of run {record['run_id']}: `down` exited {outcome.returncode}: "
            f"{first_line(outcome.output.strip().splitlines()[-1] if outcome.output.strip() else '')} (see {log_file}; "
            f"hybridflow clusters reap tries again)")


def parsed_cluster(engine: str, outcome: Outcome, timeout: float, log_file: Path) -> dict[str, Any]:
    lines = [line for line in outcome.output.splitlines() if line.strip()]
    if outcome.returncode is None:
        raise UnavailableError(f"the {engine} cluster's `up` did not finish within {timeout:g} s",
                               hint=f"see {log_file}; raise backends.{engine}.cluster.up_timeout if it needs longer")
    if outcome.returncode != 0:
        said = first_line(lines[-1]) if lines else "it printed nothing"
        raise UnavailableError(f"the {engine} cluster's `up` exited {outcome.returncode}: {said}",
                               hint=f"see {log_file}")
    try:
        cluster = json.loads(lines[-1]) if lines else None
    except ValueError:
        cluster = None
    if not isinstance(cluster, dict) or not isinstance(cluster.get("address"), str) or not cluster["address"]:
        raise UnavailableError(f"the {engine} cluster's `up` printed no address",
                               hint='its last line of output must be a JSON object like {"address": '
                                    '"tcp://10.0.0.5:8786"}')
    return cluster


def run_command(command: str, env: dict[str, str], timeout: float, log_file: Path, what: str, cwd: Path) -> Outcome:
    """`command` with bash, in a session of its own (a timeout kills all of it), its output appended to
    `log_file` and returned."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        out.write(f"--- {what} at {_now()}: {command}\n".encode())
    process = subprocess.Popen(["bash", "-c", command], cwd=cwd, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: process.stdout.read(65536), b"")),
                              daemon=True)
    reader.start()
    try:
        returncode: int | None = process.wait(timeout)
    except subprocess.TimeoutExpired:
        returncode = None
        _kill_session(process)
    except BaseException:  # a stop request: what it started is not left half made and running
        _kill_session(process)
        raise
    reader.join(1)  # a daemon it started may hold the pipe open: what it printed by its exit is read
    output = b"".join(chunks).decode(errors="replace")
    with open(log_file, "ab") as out:
        out.write(output.encode())
        out.write(f"--- {what} {'timed out' if returncode is None else f'exited {returncode}'}\n".encode())
    return Outcome(returncode, output)


def _kill_session(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


# -- provider: ssh ---------------------------------------------------------------------------------

REMOTE_LOGS = "/tmp/hybridflow-clusters"

# what a host runs to end a cluster: every process whose environment carries its name, TERM then KILL,
# then its logs printed (and removed), and its scratch removed
_SWEEP = r'''name=%(name)s
tagged() {
  for p in /proc/[0-9]*; do
    if tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qxF "HYBRIDFLOW_CLUSTER_NAME=$name"; then echo "${p#/proc/}"; fi
  done
}
pids=$(tagged)
if [ -n "$pids" ]; then kill -TERM $pids 2>/dev/null || true; fi
for _ in $(seq 50); do pids=$(tagged); [ -z "$pids" ] && break; sleep 0.2; done
if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
for log in %(logs)s/"$name"-*.log; do
  if [ -e "$log" ]; then echo "=== $(hostname): $log"; tail -c 200000 "$log"; rm -f "$log"; fi
done
rm -rf %(logs)s/"$name"-work
'''


def ssh_up(engine: str, spec, record: dict[str, Any], log_file: Path) -> dict[str, Any]:
    """Start the engine's head on the head host, wait until it answers, then its workers."""
    from . import backends

    launch_of = backends.engine(engine).cluster_launch
    if launch_of is None:
        raise UnavailableError(f"the {engine} engine has no cluster of its own to start over SSH",
                               hint=f"bring it up with backends.{engine}.cluster.provider: command")
    python = spec.python or sys.executable
    launch = launch_of(python, spec.head, spec.head_port, record["name"], spec.idle_timeout)
    deadline = time.monotonic() + spec.up_timeout
    _ssh_start(engine, spec, spec.head, [*launch.head, *spec.head_args], record["name"], "head", log_file)
    _wait_for_port(engine, spec.head, launch.port, deadline, log_file)
    for host in spec.workers:
        _ssh_start(engine, spec, host, [*launch.worker(host), *spec.worker_args], record["name"], f"worker-{host}",
                   log_file)
    return {"address": launch.address, "hosts": [h.host for h in spec.hosts]}


def ssh_down(record: dict[str, Any], spec, log_file: Path) -> str | None:
    """End the cluster's processes on each of its hosts, side by side; None when every host did."""
    import shlex

    hosts = (record.get("cluster") or {}).get("hosts") or [h.host for h in spec.hosts]
    script = _SWEEP % {"name": shlex.quote(record["name"]), "logs": REMOTE_LOGS}
    outcomes: dict[str, Outcome] = {}
    threads = [threading.Thread(target=lambda h=host: outcomes.__setitem__(h, _ssh_run(spec, h, script,
                                                                                       spec.down_timeout)))
               for host in dict.fromkeys(hosts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(log_file, "ab") as out:
        for host, outcome in outcomes.items():
            out.write(f"--- down on {host}: {_ended(outcome)}\n{outcome.output}".encode())
    failed = [host for host, outcome in outcomes.items() if outcome.returncode != 0]
    if not failed:
        return None
    return (f"the {record['engine']} cluster of run {record['run_id']}: taking it down on {', '.join(failed)} "
            f"failed ({_ended(outcomes[failed[0]])}); its processes may still run (see {log_file}; "
            f"hybridflow clusters reap tries again)")


def _ssh_start(engine: str, spec, host: str, argv: list[str], name: str, role: str, log_file: Path) -> None:
    import shlex

    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in spec.env.items())
    log = f"{REMOTE_LOGS}/{name}-{role}.log"
    script = (f"export {TAG}={shlex.quote(name)}\n{exports}mkdir -p {REMOTE_LOGS} && chmod 700 {REMOTE_LOGS}\n"
              f"setsid nohup {shlex.join(argv)} > {shlex.quote(log)} 2>&1 < /dev/null &\necho started $!\n")
    outcome = _ssh_run(spec, host, script, spec.up_timeout)
    with open(log_file, "ab") as out:
        out.write(f"--- {role} on {host}: {shlex.join(argv)}: {_ended(outcome)}\n{outcome.output}".encode())
    if outcome.returncode != 0:
        said = [line for line in outcome.output.splitlines() if line.strip()]
        raise UnavailableError(f"the {engine} cluster: starting its {role.split('-')[0]} on {host} over SSH "
                               f"{_ended(outcome)}: {first_line(said[-1]) if said else 'it said nothing'}",
                               hint=f"see {log_file}")


def _ssh_run(spec, host: str, script: str, timeout: float) -> Outcome:
    command = ["ssh", "-p", str(spec.port), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *spec.ssh_options]
    if spec.key_file:
        command += ["-i", os.path.expanduser(spec.key_file)]
    command += [f"{spec.user}@{host}" if spec.user else host, "bash -s"]
    try:
        done = subprocess.run(command, input=script.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        return Outcome(None, (exc.stdout or b"").decode(errors="replace"))
    return Outcome(done.returncode, done.stdout.decode(errors="replace"))


def _wait_for_port(engine: str, host: str, port: int, deadline: float, log_file: Path) -> None:
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise UnavailableError(f"the {engine} cluster's head on {host} did not answer on port {port}",
                                       hint=f"see {log_file}, and the head's log in {REMOTE_LOGS} there") from None
            time.sleep(0.2)


def _ended(outcome: Outcome) -> str:
    return "timed out" if outcome.returncode is None else f"exited {outcome.returncode}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def age(record: dict[str, Any]) -> float:
    """Seconds since the cluster's record was made."""
    try:
        return time.time() - datetime.fromisoformat(record["created_at"]).timestamp()
    except (KeyError, ValueError):
        return 0.0


def cluster_spec(pipeline, engine: str):
    """How the pipeline brings `engine`'s cluster up and down now (a settings.CommandCluster), or None."""
    settings = getattr(pipeline.spec.backends, engine, None)
    return getattr(settings, "cluster", None)


def reap(pipeline, records, log_file: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Take down every cluster recorded in the workdir; only ever under the pipeline's lock, where no
    run is alive, so each belongs to a run that died. Returns the records taken down, and what could
    not be (their records stay, for the next try)."""
    reaped, problems = [], []
    for key, record in records.all().items():
        if record.get("runner") == {"host": socket.gethostname(), "pid": os.getpid()}:
            continue  # this process's own (a watch session keeps its clusters between runs)
        spec = cluster_spec(pipeline, record.get("engine", ""))
        if spec is None:
            problems.append(f"the {record.get('engine')} cluster of run {record.get('run_id')}: the pipeline no "
                            f"longer says how to take it down (backends.{record.get('engine')}.cluster); take it "
                            f"down by hand, then delete its record {key}.json")
            continue
        problem = tear_down(record, spec, log_file, pipeline.root, records)
        if problem:
            problems.append(problem)
        else:
            reaped.append(record)
    return reaped, problems
