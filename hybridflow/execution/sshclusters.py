"""The `ssh` cluster provider: the engine's own cluster processes (the engine plugin's cluster_launch
says which: a Dask scheduler and workers, a Spark master and workers, a Ray head and nodes) started on
the team's hosts over SSH, each bound to its host's address, in a session of its own, with its output
in the cluster's private folder there (scratch(): mode 0700, made for the cluster, refused when another
user holds it) and HYBRIDFLOW_CLUSTER_NAME in its environment. The cluster is authenticated with
credentials made for the run (the engine's ClusterLaunch: files written into that folder, mode 0600).

Taking a cluster down ends every process on each host whose environment carries the cluster's name
(what the launched processes started too), brings their logs into the run's cluster-<engine>.log
(redacted, like every log) and removes the folder. The script each host runs is sent on ssh's input:
`env:` values and the credentials are on no command line.

Each host is also tethered to the runner before anything starts there: an SSH session whose remote end
reads until the runner's end closes, then ends the cluster's processes on that host. The runner closes
it after a teardown; so does the kernel when the runner dies however it dies (a kill -9, an OOM kill),
so a dead runner's cluster ends within seconds, with no run or reaper following. Its record and logs
stay for the reaper. (A runner whose whole machine vanished is noticed when the host's sshd notices:
its ClientAliveInterval, else TCP keepalive; Dask's idle timeout and the reaper cover that case.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from ..errors import UnavailableError, first_line
from .clustercommands import TAG, Outcome, ended

SCRATCH_ROOT = "/tmp"

# what every script run for a cluster on a host starts with: its private folder, this user's own
_PRIVATE = r'''umask 077
scratch=%(scratch)s
mkdir -p "$scratch" 2>/dev/null
if [ -L "$scratch" ] || [ ! -O "$scratch" ]; then
  echo "$scratch on $(hostname) is not a folder of this user's own (another user's, or a link): refusing it" >&2
  exit 1
fi
chmod 700 "$scratch"
'''

# what a host runs to end a cluster's processes: every one whose environment carries its name, and every
# one with a file open in its folder (Ray's raylet starts its agents with an environment of its own), TERM then KILL
_END = r'''name=%(name)s
folder=%(scratch)s
tagged() {  # one grep over every process's environment (NUL-separated): a loop of processes per pid was slow
  { grep -lxzF "HYBRIDFLOW_CLUSTER_NAME=$name" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
    find /proc/[0-9]*/fd -lname "$folder/*" 2>/dev/null | cut -d/ -f3; } | grep -vx "$$" | sort -u
}
pids=$(tagged)
if [ -n "$pids" ]; then kill -TERM $pids 2>/dev/null || true; fi
for _ in $(seq %(tries)d); do pids=$(tagged); [ -z "$pids" ] && break; sleep 0.2; done
if [ -n "$pids" ]; then kill -KILL $pids 2>/dev/null || true; fi
'''
# a teardown: the processes ended, then their logs printed, and the cluster's folder removed
_SWEEP = _END + r'''scratch=$folder
if [ -d "$scratch" ] && [ -O "$scratch" ] && [ ! -L "$scratch" ]; then
  for log in "$scratch"/*.log; do
    if [ -e "$log" ]; then echo "=== $(hostname): $log"; tail -c 200000 "$log"; fi
  done
  rm -rf "$scratch"
fi
'''


Redact = Callable[[str], str]


def _verbatim(text: str) -> str:
    return text


def scratch(name: str) -> str:
    """The cluster's private folder on each of its hosts: named after the cluster (two pipelines', two
    runs' never meet), short (Ray's socket paths under it must fit in 107 bytes)."""
    import hashlib

    return f"{SCRATCH_ROOT}/hf-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def ssh_up(engine: str, spec, record: dict[str, Any], log_file: Path,
           tethers: list[subprocess.Popen] | None = None,
           redact: Redact = _verbatim, launch=None) -> dict[str, Any]:
    """Start the engine's head on the head host, wait until it answers, then its workers, and wait
    until each has joined the cluster: a stage never waits for a worker that is not coming. `tethers`:
    where the hosts' tethers go, each started before anything else on its host (None: untethered).
    `redact`: what every line written to `log_file` passes through. `launch`: the engine's
    ClusterLaunch for it (launch_for(); default a fresh one), whose credentials the driver attaches
    with. The processes run at the hosts' normal priority: lowered, a user cannot raise it again, and
    nodes starved by other work on their host were declared dead by their head."""
    launch = launch or launch_for(engine, spec, record["name"])
    redact = _with_secrets(redact, launch.secrets)
    deadline = time.monotonic() + spec.up_timeout
    if tethers is not None:
        tethers += [_tether(spec, host.host, record["name"], launch, log_file) for host in spec.hosts]
    start = _Start(engine, spec, record["name"], launch.files, log_file, redact, deadline)
    start(spec.head, [*launch.head, *spec.head_args], "head", launch.head_ready,
          proof=lambda pid: _prove_head(engine, spec, record["name"], pid, launch.port, deadline, log_file, redact))
    _wait_for_port(engine, spec.head, launch.port, deadline, log_file)
    with ThreadPoolExecutor(max_workers=len(spec.workers)) as pool:  # side by side; a failure is raised here
        list(pool.map(lambda host: start(host, [*launch.worker(host), *spec.worker_args], f"worker-{host}",
                                         launch.joined), spec.workers))
    return {"address": launch.address, "hosts": [h.host for h in spec.hosts]}


def ssh_down(record: dict[str, Any], spec, log_file: Path, redact: Redact = _verbatim) -> str | None:
    """End the cluster's processes on each of its hosts, side by side; None when every host did."""
    import shlex

    hosts = (record.get("cluster") or {}).get("hosts") or [h.host for h in spec.hosts]
    script = _SWEEP % {"name": shlex.quote(record["name"]), "scratch": shlex.quote(scratch(record["name"])),
                       "tries": _tries(launch_for(record["engine"], spec, record["name"]).grace)}
    hosts = list(dict.fromkeys(hosts))
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        outcomes = dict(zip(hosts, pool.map(lambda host: _ssh_run(spec, host, script, spec.down_timeout,
                                                                   record["name"]), hosts)))
    for host, outcome in outcomes.items():
        _append(log_file, f"--- down on {host}: {ended(outcome)}\n{outcome.output}", redact)
    failed = [host for host, outcome in outcomes.items() if outcome.returncode != 0]
    if not failed:
        return None
    return (f"the {record['engine']} cluster of run {record['run_id']}: taking it down on {', '.join(failed)} "
            f"failed ({ended(outcomes[failed[0]])}); its processes may still run (see {log_file}; "
            f"hybridflow clusters reap tries again)")


def untether(tethers: list[subprocess.Popen], timeout: float = 30) -> None:
    """Close the runner's end of each tether (its host ends what is left of the cluster there), and
    wait for them: bounded, then killed."""
    for tether in tethers:
        with contextlib.suppress(OSError):
            tether.stdin.close()
    deadline = time.monotonic() + timeout
    for tether in tethers:
        try:
            tether.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            tether.kill()
            tether.wait()


def launch_for(engine: str, spec, name: str):
    """How the engine's cluster processes are started (backends.ClusterLaunch), with credentials made now."""
    from .. import engines as registry

    launch_of = registry.engine(engine).cluster_launch
    if launch_of is None:
        raise UnavailableError(f"the {engine} engine has no cluster of its own to start over SSH",
                               hint=f"bring it up with backends.{engine}.cluster.provider: command")
    return launch_of(spec.python or sys.executable, spec.head, spec.head_port, name, spec.idle_timeout, scratch(name))


def _tries(grace: float) -> int:
    """How many 0.2 s waits for the processes to end on SIGTERM, before SIGKILL."""
    return max(1, round(grace / 0.2))


def _with_secrets(redact: Redact, secrets: tuple[str, ...]) -> Redact:
    from ..definition.pipeline import Pipeline

    made = Pipeline.redact_with(secrets)
    return lambda text: redact(made(text))


def _append(log_file: Path, text: str, redact: Redact) -> None:
    with open(log_file, "ab") as out:
        out.write(redact(text).encode())


def _tether(spec, host: str, name: str, launch, log_file: Path) -> subprocess.Popen:
    import shlex

    script = "cat > /dev/null\n" + _END % {"name": shlex.quote(name), "scratch": shlex.quote(scratch(name)),
                                          "tries": _tries(launch.grace)}
    command = _ssh_command(spec, host, ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"])
    with open(log_file, "ab") as out:  # its end: `cat` returned on the host and the processes ended there
        out.write(f"--- tethered to {host}\n".encode())
        return subprocess.Popen([*command, f"bash -c {shlex.quote(script)}"], stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=_helper_env(name))


@dataclasses.dataclass
class _Start:
    """Starts one of a cluster's processes on a host: its private folder made (or found this user's
    own), the credentials written there, the process started with its output in a log there; then,
    where the engine says what its log shows once it is up, waits for that line. A process that exits
    before it is started again while `deadline` allows: starved by other work on its host, an engine's
    own start-up timers run out (Ray gives a node 30 s to register with its head)."""

    engine: str
    spec: Any
    name: str
    files: dict[str, str]
    log_file: Path
    redact: Redact
    deadline: float

    def __call__(self, host: str, argv: list[str], role: str, ready: str | None = None,
                 proof: Callable[[int], None] | None = None) -> int:
        """The process's id on the host, once `proof(pid)` passed and its log says `ready` (None: at once)."""
        for attempt in range(1, _STARTS + 1):
            again = attempt < _STARTS and self.deadline - time.monotonic() > 5
            what = f"the {self.engine} cluster's {role.split('-')[0]} on {host}"
            pid = self._launch(host, argv, role)
            if proof is not None:
                try:
                    proof(pid)
                except _ExitedAtOnce:
                    if not again:
                        raise
                    _append(self.log_file, f"--- {what} exited at once: starting it again\n", _verbatim)
                    continue
            if ready is None:
                return pid
            outcome, said = self._wait_until_ready(host, pid, role, ready)
            if outcome.returncode == 0:
                return pid
            if outcome.returncode == _EXITED and again:
                _append(self.log_file, f"--- {what} exited before it was up: starting it again\n", _verbatim)
                continue
            if outcome.returncode == _EXITED:
                raise UnavailableError(f"{what} exited before it was up: {_telling(said)}", hint=f"see {self.log_file}")
            raise UnavailableError(f"{what} was not up within {self.spec.up_timeout:g} s: {_telling(said)}",
                                   hint=f"see {self.log_file}")
        raise AssertionError("unreachable")

    def _launch(self, host: str, argv: list[str], role: str) -> int:
        import shlex

        folder = scratch(self.name)
        exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in self.spec.env.items())
        # printf is bash's own: no process of its own whose command line would show the content
        files = "".join(f"printf %s {shlex.quote(content)} > {shlex.quote(f'{folder}/{file}')}\n"
                        for file, content in self.files.items())
        log = shlex.quote(f"{folder}/{role}.log")
        script = (f"export {TAG}={shlex.quote(self.name)}\n{exports}"
                  f"{_PRIVATE % {'scratch': shlex.quote(folder)}}{files}"
                  f"setsid nohup {shlex.join(argv)} > {log} 2>&1 < /dev/null &\necho started $!\n")
        outcome = _ssh_run(self.spec, host, script, self.spec.up_timeout, self.name)
        _append(self.log_file, f"--- {role} on {host}: {shlex.join(argv)}: {ended(outcome)}\n{outcome.output}",
                self.redact)
        if outcome.returncode != 0:
            said = [self.redact(line) for line in outcome.output.splitlines() if line.strip()]
            raise UnavailableError(f"the {self.engine} cluster: starting its {role.split('-')[0]} on {host} over "
                                   f"SSH {ended(outcome)}: {first_line(said[-1]) if said else 'it said nothing'}",
                                   hint=f"see {self.log_file}")
        started = [line.split()[1] for line in outcome.output.splitlines() if line.startswith("started ")]
        return int(started[-1]) if started and started[-1].isdigit() else 0

    def _wait_until_ready(self, host: str, pid: int, role: str, ready: str) -> tuple[Outcome, list[str]]:
        """On the host: until the process's log says `ready` (0), the process exited (_EXITED) or the
        deadline passed; with the log's last lines when it is not ready."""
        import shlex

        script = _READY % {"pid": pid, "ready": shlex.quote(ready),
                           "log": shlex.quote(f"{scratch(self.name)}/{role}.log"),
                           "tries": max(1, round((self.deadline - time.monotonic()) / 0.2))}
        outcome = _ssh_run(self.spec, host, script, max(1.0, self.deadline - time.monotonic()) + 10, self.name)
        said = [self.redact(line) for line in outcome.output.splitlines() if line.strip()]
        if outcome.returncode != 0:
            _append(self.log_file, f"--- {role} on {host}, not up: {ended(outcome)}\n"
                    + "".join(f"{line}\n" for line in said), _verbatim)
        return outcome, said


_STARTS = 3  # tries of a process that exits before it is up


def _telling(said: list[str]) -> str:
    """The line of a log's tail that says what went wrong: the last naming an error, else the last."""
    import re

    errors = [line for line in said if re.search(r"(Error|Exception|error:|refused|denied)", line)]
    return first_line((errors or said)[-1]) if said else "it said nothing"


def _prove_head(engine: str, spec, name: str, pid: int, port: int, deadline: float, log_file: Path,
                redact: Redact) -> None:
    """Wait, on the head's host, until the head process started there holds its port, before anything
    attaches to that port: a head that exited (a wrong `python:`, a port it could not bind) fails with
    what it said, at once; a port held by a process not of this cluster (another run's cluster, a
    stranger's service) fails naming host and port, instead of attaching to it."""
    import shlex

    script = _PROOF % {"name": shlex.quote(name), "pid": pid, "port": port,
                       "log": shlex.quote(f"{scratch(name)}/head.log"),
                       "tries": max(1, round((deadline - time.monotonic()) / 0.2))}
    outcome = _ssh_run(spec, spec.head, script, max(1.0, deadline - time.monotonic()) + 10, name)
    said = [redact(line) for line in outcome.output.splitlines() if line.strip()]
    if outcome.returncode == 0:
        return
    _append(log_file, f"--- the head on {spec.head}: {ended(outcome)}\n" + "".join(f"{line}\n" for line in said),
            _verbatim)
    if outcome.returncode == _TAKEN:
        raise UnavailableError(f"the {engine} cluster's head on {spec.head}: port {port} there is held by a process "
                               f"not of this cluster (another run's cluster, or another service)",
                               hint=f"free the port, or set backends.{engine}.cluster.head_port to a free one")
    if outcome.returncode == _EXITED:
        raise _ExitedAtOnce(f"the {engine} cluster's head on {spec.head} exited at once: "
                               f"{first_line(said[-1]) if said else 'it said nothing'}", hint=f"see {log_file}")
    raise UnavailableError(f"the {engine} cluster's head on {spec.head} did not answer on port {port} within "
                           f"{spec.up_timeout:g} s", hint=f"see {log_file}")


class _ExitedAtOnce(UnavailableError):
    """The head exited before it held its port: a wrong `python:`, or a port its last holder had not
    yet let go of (a cluster ending as this one starts); started again while tries last."""


_TAKEN, _EXITED = 3, 4
# the process exited: what it started goes with it (setsid made it its group's leader), so a fresh
# start meets none of it (on its port either); its log's last lines say why
_GONE = r'''    if [ %(pid)d -gt 1 ]; then kill -TERM -- -%(pid)d 2>/dev/null; fi
    sleep 0.5; tail -n 20 %(log)s 2>/dev/null; exit 4
'''
# run on a process's host: until its log says it is up, while it lives
_READY = r'''for _ in $(seq %(tries)d); do
  if grep -qF -- %(ready)s %(log)s 2>/dev/null; then exit 0; fi
  if ! kill -0 %(pid)d 2>/dev/null; then
''' + _GONE + r'''  fi
  sleep 0.2
done
tail -n 20 %(log)s 2>/dev/null
exit 5
'''
# run on the head's host: the head process alive, and the holder of its port one of the cluster's processes;
# a holder whose environment is readable and empty is ending (its memory goes before its sockets): waited
# for; one ss names no process of (another user's) or whose environment this user cannot read: a stranger.
# ss reads the processes' sockets before it lists the sockets, so a socket opened in between is shown
# once without its process: only a port unnamed in three readings in a row is a stranger's
_PROOF = r'''name=%(name)s
holders=
unnamed=0
for _ in $(seq %(tries)d); do
  holders=$(ss -Hltnp "sport = :%(port)d" 2>/dev/null)
  if [ -n "$holders" ]; then
    pids=$(echo "$holders" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u)
    if [ -z "$pids" ]; then
      unnamed=$((unnamed + 1))
      if [ "$unnamed" -ge 3 ]; then echo "$holders"; exit 3; fi
    else
      unnamed=0
    fi
    for holder in $pids; do
      environ=/proc/"$holder"/environ
      if grep -qxzF "HYBRIDFLOW_CLUSTER_NAME=$name" "$environ" 2>/dev/null; then exit 0; fi
      if [ ! -r "$environ" ] || [ -n "$(head -c 1 "$environ" 2>/dev/null)" ]; then echo "$holders"; exit 3; fi
    done
  else
    unnamed=0
    if ! kill -0 %(pid)d 2>/dev/null; then
''' + _GONE + r'''    fi
  fi
  sleep 0.2
done
if [ -n "$holders" ]; then echo "$holders"; exit 3; fi
exit 5
'''


def _ssh_command(spec, host: str, options: list[str] = ()) -> list[str]:
    command = ["ssh", "-p", str(spec.port), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *options,
               *spec.ssh_options]
    if spec.key_file:
        command += ["-i", os.path.expanduser(spec.key_file)]
    return [*command, f"{spec.user}@{host}" if spec.user else host]


def _helper_env(name: str) -> dict[str, str]:
    """The environment of this runner's ssh clients for a cluster. Tagged, so that a stage ending while
    one runs does not end it as its leftover; with a value of its own, so that a teardown on a host
    that is also the runner's does not end the very ssh running it. (ssh sends no such variable on.)"""
    return {**os.environ, TAG: f"{name}.ssh"}


def _ssh_run(spec, host: str, script: str, timeout: float, name: str) -> Outcome:
    command = [*_ssh_command(spec, host), "bash -s"]
    try:
        done = subprocess.run(command, input=script.encode(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, start_new_session=True, env=_helper_env(name))
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
                                       hint=f"see {log_file}, and the head's log in the cluster's folder "
                                            f"{SCRATCH_ROOT}/hf-* there") from None
            time.sleep(0.2)
