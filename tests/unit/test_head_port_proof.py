"""The head's port proof, the script run on a head's host before anything attaches to its port. `ss -p`
reads the processes' sockets before it lists the listening sockets, so a socket opened between the two
is listed once with no process (CI met it: a Dask head refused as a stranger's, 2 s after it started).
Here `ss` is a stand-in on PATH that answers as the real one did in that race; the holder is a real
process, tagged as the cluster's or not."""
import os
import subprocess
import sys
import textwrap

import pytest

from hybridflow.execution.clustercommands import TAG
from hybridflow.execution.sshclusters import _PROOF

LINE = "LISTEN 0      2048   127.0.0.1:8786 0.0.0.0:*"


def proof(tmp_path, holder_pid: int, unnamed_readings: int) -> subprocess.CompletedProcess:
    """The proof script for cluster `hf-proof`, where `ss` lists the port `unnamed_readings` times with
    no process, then with the holder's id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    count = tmp_path / "readings"
    count.write_text("0")
    fake = bin_dir / "ss"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        n=$(( $(cat {count}) + 1 )); echo $n > {count}
        if [ $n -le {unnamed_readings} ]; then echo '{LINE}'
        else echo '{LINE} users:(("python",pid={holder_pid},fd=3))'; fi
        """))
    fake.chmod(0o755)
    script = _PROOF % {"name": "hf-proof", "pid": holder_pid, "port": 8786, "log": str(tmp_path / "head.log"),
                       "tries": 20}
    return subprocess.run(["bash", "-s"], input=script.encode(), capture_output=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})


@pytest.fixture
def holder():
    """A process of the cluster `hf-proof`, tagged as its processes are."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env={**os.environ, TAG: "hf-proof"})
    yield process
    process.kill()
    process.wait()


def test_a_port_listed_once_without_its_process_is_read_again_and_found_the_clusters(tmp_path, holder):
    done = proof(tmp_path, holder.pid, unnamed_readings=2)
    assert done.returncode == 0, done.stdout


def test_a_port_never_named_is_refused_as_a_strangers(tmp_path, holder):
    done = proof(tmp_path, holder.pid, unnamed_readings=100)
    assert done.returncode == 3, done.stdout
    assert LINE in done.stdout.decode()
    assert (tmp_path / "readings").read_text().strip() == "3"


def test_a_port_held_by_an_untagged_process_is_refused_at_once(tmp_path):
    untagged = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={key: value for key, value in os.environ.items() if key != TAG})
    try:
        done = proof(tmp_path, untagged.pid, unnamed_readings=0)
    finally:
        untagged.kill()
        untagged.wait()
    assert done.returncode == 3, done.stdout
    assert (tmp_path / "readings").read_text().strip() == "1"
