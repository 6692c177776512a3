"""A value from ${env:...} never reaches a file under the workdir in clear, and what a run writes under
runs/ is its owner's only. The engines' own processes are stood in for by a child process that writes
to the file descriptors it inherited, as a Spark JVM or a Dask worker does (the real engines are left
to the engine tests: they are slow to start)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from hybridflow.backends.engineoutput import EngineOutput, StreamRedactor
from hybridflow.backends.python import PythonBackend
from hybridflow.data.hashing import HashCache
from hybridflow.data.tables import read_arrow
from hybridflow.store.catalog import Catalog
from hybridflow.store.state import RunStore, recorded_arguments, resumed_arguments

SECRET = "s3cr3t-planted-7d1f"
cli = CliRunner()

# An engine's process outlives its start: it writes after the redirect has ended, in pieces (the
# secret split across two writes), a lot (more than any pipe holds), and a traceback on stderr.
CHATTY_ENGINE = r"""
import os, sys, time
secret = os.environ["HF_TEST_SECRET"]
time.sleep(0.2)
print("engine: connecting with", secret, flush=True)
sys.stderr.write("half " + secret[:7]); sys.stderr.flush()
time.sleep(0.05)
sys.stderr.write(secret[7:] + " whole\n"); sys.stderr.flush()
for i in range(20000):
    sys.stdout.write(f"line {i} {secret} padding padding padding\n")
sys.stdout.flush()
raise RuntimeError("task failed for token " + secret)
"""

STAGES = '''
import os
from pathlib import Path

import pyarrow as pa


def leak(raw, token, ctx):
    ctx.log.info("token is %s", token)
    print("printed", token)
    return raw


def boom(copied, token, fail):
    print("boom sees", fail)
    if Path(os.environ["HF_TEST_FAIL_FILE"]).exists():
        raise RuntimeError("boom with " + fail)
    return pa.table({"resumed_with_the_secret": [fail == "x" + token]})
'''

PIPELINE = '''
name: demo
params: {token: "${env:HF_TEST_SECRET}", fail: "no"}
datasets:
  raw: {path: "raw/${env:HF_TEST_SECRET}/events.parquet"}
stages:
  leak: {run: "mypkg.steps:leak", inputs: [raw], outputs: [copied]}
  boom: {run: "mypkg.steps:boom", inputs: [copied], outputs: [result]}
'''


@pytest.fixture
def secret_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TEST_SECRET", SECRET)
    flag = tmp_path / "fail-now"
    flag.touch()
    monkeypatch.setenv("HF_TEST_FAIL_FILE", str(flag))
    return flag


@pytest.fixture
def chatty_python_engine(monkeypatch):
    """The python backend, starting a child process the way a real engine starts its JVM or workers."""
    children = []

    def start(self, code=()):
        children.append(subprocess.Popen([sys.executable, "-c", CHATTY_ENGINE]))

    monkeypatch.setattr(PythonBackend, "start", start)
    yield children
    for child in children:
        child.kill()
        child.wait()


def test_no_file_under_the_workdir_holds_a_secret_and_runs_are_private(project, secret_env, chatty_python_engine):
    project.stages(STAGES)
    raw = project.root / "raw" / SECRET / "events.parquet"
    raw.parent.mkdir(parents=True)
    pq.write_table(pa.table({"n": [1, 2, 3]}), raw)
    path = project.pipeline(PIPELINE)

    failed = cli.invoke(_app(), ["run", str(path), "--param", f"fail=x{SECRET}"])
    assert failed.exit_code == 1, failed.output
    assert SECRET not in failed.output and "boom with x***" in failed.output
    secret_env.unlink()
    resumed = cli.invoke(_app(), ["run", str(path), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    # the resumed stage got the very value typed on the command line, read again from the environment
    result = Catalog(project.home("demo")).current("result")
    assert read_arrow(result.source()).column("resumed_with_the_secret").to_pylist() == [True]

    workdir = project.root / ".hybridflow"
    run = RunStore(workdir / "runs.db").runs(limit=2)[-1]  # the first run, which failed
    arguments = json.loads(run["arguments"])
    assert arguments["params"] == ["fail=x${env:HF_TEST_SECRET}"] and arguments["env_params"] == [0]
    for child in chatty_python_engine:
        child.wait(timeout=30)

    files = [f for f in workdir.rglob("*") if f.is_file()]
    assert any(f.name == "engines.log" for f in files) and any(f.name == "hashes.json" for f in files)
    holding = [str(f.relative_to(workdir)) for f in files if SECRET.encode() in f.read_bytes()]
    assert not holding, f"the secret is in clear in {holding}"

    engines_log = (Path(run["run_dir"]) / "logs" / "engines.log").read_text()
    assert "engine: connecting with ***" in engines_log and "half *** whole" in engines_log
    assert "RuntimeError: task failed for token ***" in engines_log  # all of it, to the last line
    assert engines_log.count("padding padding") == 20000
    boom_log = (Path(run["run_dir"]) / "logs" / "boom.log").read_text()
    assert "boom sees x***" in boom_log

    for item in (workdir / "demo" / "runs").rglob("*"):
        mode = stat.S_IMODE(item.stat().st_mode)
        assert mode == (0o700 if item.is_dir() else 0o600), f"{item.relative_to(workdir)} is {oct(mode)}"
    assert stat.S_IMODE((workdir / "demo" / "hashes.json").stat().st_mode) == 0o600


def _app():
    from hybridflow.cli import app

    return app


def test_engine_output_redacts_what_children_write_after_the_redirect_and_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TEST_SECRET", SECRET)
    output = EngineOutput(tmp_path / "engines.log", {SECRET, "unused-other-secret"})
    with output.redirected():
        child = subprocess.Popen([sys.executable, "-c", CHATTY_ENGINE])
        os.write(1, f"this process too: {SECRET}\n".encode())  # fd 1 of this very process, while redirected
    assert child.wait(timeout=60) == 1
    assert output.close() is True
    output.close()  # twice is fine
    data = (tmp_path / "engines.log").read_text()
    assert SECRET not in data
    assert "this process too: ***" in data and "half *** whole" in data
    assert data.count("padding padding") == 20000 and "task failed for token ***" in data
    assert stat.S_IMODE((tmp_path / "engines.log").stat().st_mode) == 0o600


def test_engine_output_close_does_not_wait_on_a_straggler_and_still_copies_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TEST_SECRET", SECRET)
    output = EngineOutput(tmp_path / "engines.log", {SECRET})
    # the straggler writes once the test lets it (or after 60 s: a close that waited for it returns then)
    late = ("import os, select, sys; select.select([sys.stdin], [], [], 60); "
            "print('late', os.environ['HF_TEST_SECRET'], flush=True)")
    with output.redirected():
        child = subprocess.Popen([sys.executable, "-c", late], stdin=subprocess.PIPE)
    assert output.close(timeout=0.2) is False  # the child still holds the pipe
    assert child.poll() is None, "close() waited for the straggler to end"
    child.stdin.close()
    child.wait(timeout=30)
    deadline = time.monotonic() + 10
    while "late ***" not in (tmp_path / "engines.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "engines.log").read_text() == "late ***\n"


def test_stream_redactor_finds_a_secret_split_anywhere():
    # "planted" is a secret too, and inside the longer one: the whole longer one is replaced
    text = f"a {SECRET} b {SECRET}{SECRET} planted s3cr3 end".encode()
    for cut in range(len(text) + 1):
        for second_cut in (cut, min(cut + 3, len(text)), len(text)):
            redactor = StreamRedactor({SECRET, "planted"})
            out = redactor.feed(text[:cut]) + redactor.feed(text[cut:second_cut]) + redactor.feed(text[second_cut:])
            assert out + redactor.flush() == b"a *** b ****** *** s3cr3 end", (cut, second_cut)
    redactor = StreamRedactor({SECRET})
    assert redactor.feed(b"no secret here\n") == b"no secret here\n"  # nothing held back needlessly
    assert redactor.feed(b"until s3cr") == b"until " and redactor.flush() == b"s3cr"


def test_arguments_keep_a_secret_as_its_reference_and_resume_reads_it_again():
    arguments = {"only": [], "params": [f"fail=x{SECRET}", "n=3", f"stage.k={SECRET}/{SECRET}"], "force": None}
    recorded = recorded_arguments(arguments, {SECRET}, {SECRET: "HF_TEST_SECRET"})
    assert SECRET not in json.dumps(recorded)
    assert recorded["params"] == ["fail=x${env:HF_TEST_SECRET}", "n=3",
                                  "stage.k=${env:HF_TEST_SECRET}/${env:HF_TEST_SECRET}"]
    assert resumed_arguments(recorded, {"HF_TEST_SECRET": SECRET}) == arguments
    from hybridflow.errors import UsageError

    with pytest.raises(UsageError, match=r"--param fail held the value of \$HF_TEST_SECRET, which is not set"):
        resumed_arguments(recorded, {})
    lost = recorded_arguments(arguments, {SECRET}, {})  # no variable holds it any more
    assert SECRET not in json.dumps(lost) and lost["params"][0] == "fail=x***"
    with pytest.raises(UsageError, match="--resume cannot repeat --param fail"):
        resumed_arguments(lost, {"HF_TEST_SECRET": SECRET})
    plain = {"params": ["n=3"]}
    assert recorded_arguments(plain, {SECRET}, {SECRET: "HF_TEST_SECRET"}) == plain
    assert resumed_arguments(plain, {}) == plain


def test_hash_cache_keeps_no_path_and_still_hits(tmp_path, monkeypatch):
    data = tmp_path / SECRET / "events.csv"
    data.parent.mkdir()
    data.write_text("a,b\n1,2\n")
    monkeypatch.setattr("hybridflow.data.hashing.RECENT_NS", 0)  # the file was just written: trust it anyway
    cache_file = tmp_path / "cache" / "hashes.json"
    first = HashCache(cache_file)
    digest = first.sha256(data)
    first.save()
    assert SECRET not in cache_file.read_text() and "events.csv" not in cache_file.read_text()
    assert stat.S_IMODE(cache_file.stat().st_mode) == 0o600
    again = HashCache(cache_file)
    monkeypatch.setattr("hybridflow.data.hashing.file_sha256", lambda path: pytest.fail("hashed again"))
    assert again.sha256(data) == digest


def test_a_cache_written_with_plain_paths_is_replaced(tmp_path):
    data = tmp_path / SECRET / "events.csv"
    data.parent.mkdir()
    data.write_text("x\n")
    cache_file = tmp_path / "hashes.json"
    cache_file.write_text(json.dumps({str(data): [1, 2, 3, 4, 5, "0" * 64]}))
    HashCache(cache_file).save()  # nothing hashed: the old file still goes
    assert SECRET not in cache_file.read_text()


def test_a_watch_session_records_its_runs_arguments_without_the_secret(project, secret_env):
    """A watch session's runs are made as any run is (runner.new_runner): a --param holding a secret is
    recorded as the ${env:...} that holds it, never in clear."""
    import hybridflow

    project.stages(STAGES)
    raw = project.root / "raw" / SECRET / "events.parquet"
    raw.parent.mkdir(parents=True)
    pq.write_table(pa.table({"n": [1, 2, 3]}), raw)
    secret_env.unlink()  # the stage does not fail: the run succeeds
    result = hybridflow.watch(project.pipeline(PIPELINE), params=[f"token=x{SECRET}"], runs=1)
    assert result.status == "success"
    [run] = RunStore(project.root / ".hybridflow" / "runs.db").runs(limit=1)
    assert SECRET not in run["arguments"]
    assert json.loads(run["arguments"])["params"] == ["token=x${env:HF_TEST_SECRET}"]


def test_a_secret_is_redacted_also_as_json_spells_it_inside_a_dumped_value():
    """A value dumped to JSON before it is redacted (an MLflow param, a record's field) escapes a
    secret's quotes, backslashes and non-ASCII letters: those spellings are redacted too."""
    import json

    from hybridflow.definition.pipeline import Pipeline

    secret = 'pa"ss\\wörd'
    redact = Pipeline.redact_with([secret])
    assert redact(json.dumps({"db": {"password": secret}})) == json.dumps({"db": {"password": "***"}})
    assert redact(json.dumps([secret], ensure_ascii=False)) == json.dumps(["***"])
    assert redact(f"plain {secret}.") == "plain ***."
