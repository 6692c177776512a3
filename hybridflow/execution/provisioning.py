"""Clusters brought up for one run and taken down after it: an engine whose `backends.<engine>.cluster`
section says how is attached to the cluster brought up for it, and the cluster is taken down as soon
as no remaining stage needs the engine, at the run's end, on failure, on a stop request and on a
timeout (see enginepool).

What in-process teardown cannot survive (a kill -9, an OOM kill) the workdir records: each cluster is
recorded there before it is brought up and the record removed once it is down, and every run starts
by taking down the clusters recorded by runs that are no longer alive (`hybridflow clusters reap`
does the same on demand). Under the pipeline's lock no other run is alive, so every record found
then belongs to a dead one, except a `--watch` session's: it keeps its clusters up between its runs,
outside the lock, and its records name it (host, pid, start time) as alive.

Two providers say how: `ssh` (sshclusters: the engine's own cluster processes on the team's hosts),
and `command`: the team's own `up` and `down` commands, which is how Terraform, `kubectl apply`, `ray
up` or a cloud CLI plug in.

`command`'s commands run with bash in the pipeline's folder, in a session of their own, with these variables:
    HYBRIDFLOW_CLUSTER_NAME  hf-<pipeline>-<run>-<engine>: a name to tag what they start with (every
                             process started here inherits it, and hybridflow leaves those running)
    HYBRIDFLOW_RUN_ID, HYBRIDFLOW_PIPELINE, HYBRIDFLOW_ENGINE
    HYBRIDFLOW_CLUSTER       (down) the JSON object `up` printed
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
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..data import untrusted
from ..errors import UnavailableError, first_line
from .clustercommands import TAG, Outcome, ended

log = logging.getLogger("hybridflow")
_COMMAND = "HYBRIDFLOW_CLUSTER_COMMAND"
# bash runs the command held in the environment, which the processes it starts do not inherit
_FROM_ENVIRONMENT = f'command=${_COMMAND}; unset {_COMMAND}; eval "$command"'

@dataclass
class RunClusters:
    """The clusters of one run, by engine."""

    pipeline: Any  # a pipeline.Pipeline
    run_id: str
    log_dir: Path
    records: Any  # clusterrecords.LocalRecords or ObjectRecords
    up_clusters: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # teardowns that failed: said at the run's end
    tethers: dict[str, list] = field(default_factory=dict)  # ssh provider: each engine's hosts' tethers
    launches: dict[str, Any] = field(default_factory=dict)  # ssh provider: each engine's ClusterLaunch (credentials)
    # a watch session's clusters outlive its runs, outside the lock: their records are written again
    # every `beat_every` seconds, so a reaper on another machine sees the session alive (keep_beating)
    beat_every: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _beating: threading.Event | None = None

    def bring_up(self, engine: str, spec) -> dict[str, Any]:
        """Bring `engine`'s cluster up as `spec` (a settings.ClusterSection) says; what its `up` said
        ({"address": ..., and "hosts" or "nodes" where known}). Recorded in the workdir first; a
        failed `up` is followed by `down`, so nothing is left behind."""
        key = f"{self.run_id}-{engine}"
        record = {"run_id": self.run_id, "pipeline": self.pipeline.name, "engine": engine, "provider": spec.provider,
                  "name": cluster_name(self.pipeline.name, self.run_id, engine), "state": "starting",
                  "runner": this_runner(), "created_at": now_text()}
        if self.beat_every is not None:
            record["beat_every"] = self.beat_every
        self.records.put(key, record)
        with self._lock:
            self.up_clusters[engine] = record
        try:
            if spec.provider == "ssh":
                from .sshclusters import launch_for, ssh_up

                launch = launch_for(engine, spec, record["name"])  # credentials made for this cluster
                with self._lock:
                    tethers = self.tethers.setdefault(engine, [])
                    self.launches[engine] = launch
                cluster = ssh_up(engine, spec, record, self._log(engine), tethers, self.redact, launch)
            else:
                outcome = run_command(spec.up, cluster_env(record), spec.up_timeout, self._log(engine), "up",
                                      self.pipeline.root, self.redact)
                cluster = parsed_cluster(engine, outcome, spec.up_timeout, self._log(engine))
        except BaseException:  # a failed `up`, a timeout, a stop request: whatever it got as far as making
            self.take_down(engine, spec)
            raise
        # this run's `down` gets what `up` printed; the stored record no ${env:...} value (clusterrecords)
        record.update(state="up", cluster=cluster, up_at=now_text())
        self.records.put(key, record)
        return cluster

    def keep_beating(self, every: float) -> None:
        """From now on (a watch session, before its first cluster), write each cluster's record again
        every `every` seconds until stop_beating(): a reaper elsewhere, which cannot ask this machine
        whether the session lives, sees the record's age by the store's own clock."""
        self.beat_every = every
        if self._beating is None:
            self._beating = threading.Event()
            threading.Thread(target=self._beat, args=(self._beating,), name="hybridflow-cluster-beat",
                             daemon=True).start()

    def stop_beating(self) -> None:
        if self._beating is not None:
            self._beating.set()
            self._beating = None

    def _beat(self, stopped: threading.Event) -> None:
        while not stopped.wait(self.beat_every):
            for engine in list(self.up_clusters):
                with self._lock:  # held while written: a record its teardown deleted is never written again
                    record = self.up_clusters.get(engine)
                    if record is None:
                        continue
                    try:
                        self.records.put(f"{self.run_id}-{engine}", record)
                    except Exception as exc:  # noqa: BLE001 - a beat that fails is tried again at the next
                        log.warning("could not renew the record of cluster %s: %s", record.get("name"),
                                    first_line(exc))

    def credentials(self, engine: str) -> tuple[dict[str, Any], tuple[str, ...]]:
        """What the engine's settings get to attach to the cluster brought up for it (beside its
        address), and the values among them to redact: none for a `command` provider's."""
        with self._lock:
            launch = self.launches.get(engine)
        return (dict(launch.attach), launch.secrets) if launch is not None else ({}, ())

    def redact(self, text: str) -> str:
        """The pipeline's redaction, and the credentials made for this run's clusters."""
        with self._lock:
            made = [secret for launch in self.launches.values() for secret in launch.secrets]
        return self.pipeline.redact_with([*self.pipeline.secrets, *made])(text)

    def take_down(self, engine: str, spec) -> None:
        """Run `down` for the engine's cluster (bounded by its timeout). Done: the record goes. Failed or
        hung: the record stays, for the next run or `hybridflow clusters reap`, and the run says so."""
        self.detach(engine, spec)()

    def detach(self, engine: str, spec) -> Callable[[], None]:
        """The engine's cluster, no longer this run's from now (a fresh one may be brought up for the
        engine at once): what takes it down, to be called now or in a thread of its own."""
        with self._lock:
            record = self.up_clusters.pop(engine, None)
            tethers = self.tethers.pop(engine, [])
            self.launches.pop(engine, None)

        redact = self.redact  # with this cluster's credentials, which the engine no longer holds

        def down() -> None:
            if record is None:
                return
            try:
                problem = tear_down(record, spec, self._log(engine), self.pipeline.root, self.records, redact)
            finally:
                if tethers:
                    from .sshclusters import untether

                    untether(tethers)
            if problem:
                self.problems.append(problem)
        return down

    def _log(self, engine: str) -> Path:
        return self.log_dir / f"cluster-{engine}.log"


def this_runner() -> dict[str, Any]:
    """What says which process brought a cluster up: its host, its pid, and when it started (a pid
    reused by another process since is not it)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _started(os.getpid())}


def runner_alive(runner: Any) -> bool:
    """Whether the process that brought a cluster up still runs (on this host: one elsewhere cannot
    be asked, and its tethers end its clusters if it died)."""
    if not isinstance(runner, dict) or runner.get("host") != socket.gethostname():
        return False
    pid = runner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    started = _started(pid)
    return started is not None and runner.get("started", started) == started


def _started(pid: int) -> int | None:
    """A process's start time (clock ticks after boot), None when it is gone (a zombie, killed and not
    yet waited for by a parent or a subreaper, is gone too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def cluster_nodes(cluster: dict[str, Any]) -> int | None:
    """How many hosts a cluster runs on (what its node-seconds count): the `nodes` its `up` printed,
    or its list of hosts; None when neither says."""
    nodes = cluster.get("nodes")
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0:
        return nodes
    hosts = cluster.get("hosts")
    return len(set(hosts)) if isinstance(hosts, list) and hosts else None


def cluster_name(pipeline: str, run_id: str, engine: str) -> str:
    return f"hf-{pipeline}-{run_id}-{engine}"


def cluster_env(record: dict[str, Any]) -> dict[str, str]:
    env = {TAG: record["name"], "HYBRIDFLOW_RUN_ID": record["run_id"], "HYBRIDFLOW_PIPELINE": record["pipeline"],
           "HYBRIDFLOW_ENGINE": record["engine"]}
    if "cluster" in record:
        env["HYBRIDFLOW_CLUSTER"] = json.dumps(record["cluster"])
    return env


def tear_down(record: dict[str, Any], spec, log_file: Path, cwd: Path, records,
              redact: Callable[[str], str] | None = None) -> str | None:
    """`down` for a recorded cluster; None when it is down (and its record removed), else what went
    wrong. What it writes to `log_file` passes through `redact` (default the records' own redaction)."""
    redact = redact or records.redact
    if spec.provider == "ssh":
        from .sshclusters import ssh_down

        problem = ssh_down(record, spec, log_file, redact)
    else:
        problem = _command_down(record, spec, log_file, cwd, redact)
    key = f"{record['run_id']}-{record['engine']}"
    if problem is None:
        records.delete(key)
    else:
        record.update(state="down failed", down_failed_at=now_text())
        records.put(key, record)
    return problem


def _command_down(record: dict[str, Any], spec, log_file: Path, cwd: Path, redact) -> str | None:
    outcome = run_command(spec.down, cluster_env(record), spec.down_timeout, log_file, "down", cwd, redact)
    if outcome.returncode == 0:
        return None
    if outcome.returncode is None:
        return (f"the {record['engine']} cluster of run {record['run_id']}: `down` did not finish within "
                f"{spec.down_timeout:g} s and was killed; the cluster may still be up (see {log_file}; "
                f"hybridflow clusters reap tries again)")
    said = outcome.output.strip().splitlines()
    return (f"the {record['engine']} cluster of run {record['run_id']}: `down` exited {outcome.returncode}: "
            f"{first_line(redact(said[-1]) if said else '')} (see {log_file}; "
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


def run_command(command: str, env: dict[str, str], timeout: float, log_file: Path, what: str, cwd: Path,
                redact: Callable[[str], str] = lambda text: text) -> Outcome:
    """`command` with bash, in a session of its own (a timeout kills all of it), its output appended to
    `log_file` (through `redact`) and returned. The command, its ${env:...} values expanded, reaches
    bash through the environment: on a command line anyone on this machine could read it in `ps`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        out.write(redact(f"--- {what} at {now_text()}: {command}\n").encode())
    process = subprocess.Popen(["bash", "-c", _FROM_ENVIRONMENT], cwd=cwd,
                               env={**os.environ, **env, _COMMAND: command}, stdin=subprocess.DEVNULL,
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
    outcome = Outcome(returncode, b"".join(chunks).decode(errors="replace"))
    with open(log_file, "ab") as out:
        out.write(redact(f"{outcome.output}--- {what} {ended(outcome)}\n").encode())
    return outcome


def _kill_session(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def now_text() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def age(record: dict[str, Any]) -> float:
    """Seconds since the cluster's record was made."""
    try:
        return time.time() - datetime.fromisoformat(record["created_at"]).timestamp()
    except (KeyError, ValueError):
        return 0.0


def cluster_spec(pipeline, engine: str):
    """How the pipeline brings `engine`'s cluster up and down now (a settings.ClusterSection), or None."""
    settings = pipeline.engine_settings(engine)
    return getattr(settings, "cluster", None)


def _still_beating(key: str, record: dict[str, Any], records) -> bool:
    """Whether a watch session's record was written again lately (its age by the store's own clock,
    never compared with this machine's): it lives, wherever it runs, until its beat stops for a lease
    length (HYBRIDFLOW_LEASE_SECONDS) and at least two beats."""
    every = record.get("beat_every")
    if isinstance(every, bool) or not isinstance(every, (int, float)) or every <= 0:
        return False
    from ..store.lock import lease_seconds

    age = records.age(key)
    return age is None or age < max(lease_seconds(), 2 * every)  # an age the store cannot tell: alive


def _refused_record(key: str, record: dict[str, Any], records) -> str | None:
    """Why a cluster record read from the workdir may not become an ssh target or a command's
    environment (a name, a run id or a host it could not hold), or None."""
    where = f"the cluster record {key}.json in {getattr(records, 'prefix', None) or records.folder}"
    cluster = record.get("cluster") if isinstance(record.get("cluster"), dict) else {}
    try:
        for field in ("name", "engine", "pipeline"):
            untrusted.name(record.get(field), where)
        untrusted.run_id(record.get("run_id"), where)
        hosts = cluster.get("hosts") or []
        for host in hosts if isinstance(hosts, list) else [repr(hosts)]:  # a lone string is no list of hosts
            untrusted.host(host, where)
    except untrusted.UntrustedValue as exc:
        return exc.one_line()
    return None


def reap(pipeline, records, log_file: Path, confirm=lambda: None) -> tuple[list[dict[str, Any]], list[str]]:
    """Take down every cluster recorded in the workdir by a process no longer alive; only ever under the
    pipeline's lock, where no run is, so each belongs to a run that died (a live watch session's, kept
    between its runs, are left alone). `confirm()`, the lock's, proves before each that the lock is
    still held (it raises otherwise): a runner that lost its lease must not take down the clusters of
    the run that holds it now. Returns the records taken down, and what could not be (their records
    stay, for the next try)."""
    reaped, problems = [], []
    for key, record in records.all().items():
        if runner_alive(record.get("runner")) or _still_beating(key, record, records):
            continue  # this process's own, or a live watch session's, which keeps its clusters between runs
        refused = _refused_record(key, record, records)
        if refused:
            problems.append(refused)
            continue
        spec = cluster_spec(pipeline, record.get("engine", ""))
        if spec is None:
            problems.append(f"the {record.get('engine')} cluster of run {record.get('run_id')}: the pipeline no "
                            f"longer says how to take it down (backends.{record.get('engine')}.cluster); take it "
                            f"down by hand, then delete its record {key}.json")
            continue
        confirm()
        problem = tear_down(record, spec, log_file, pipeline.root, records)
        if problem:
            problems.append(problem)
        else:
            reaped.append(record)
    return reaped, problems
