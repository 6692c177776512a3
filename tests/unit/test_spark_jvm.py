"""The options of the driver JVM hybridflow launches for Spark (the JVM itself is checked in
tests/engines/spark/test_contract.py)."""

from __future__ import annotations

from hybridflow.backends.spark.backend import SparkBackend
from hybridflow.backends.spark.conf import DRIVER_JIT, session_conf
from hybridflow.engines.spark import SparkSettings


def driver_options(settings: SparkSettings, tmp_path) -> list[str]:
    return session_conf(SparkBackend(settings, tmp_path))["spark.driver.extraJavaOptions"].split()


def test_the_driver_jvm_compiles_only_hot_code_with_c2(tmp_path):
    options = driver_options(SparkSettings(master="local[2]"), tmp_path)
    assert options[:4] == DRIVER_JIT.split()
    assert "-XX:Tier4InvocationThreshold=150000" in options
    assert "-XX:-UsePerfData" in options


def test_the_pipelines_own_jit_flags_come_after_ours_so_they_win(tmp_path):
    """HotSpot takes the last of a flag given twice: a pipeline can put C2's thresholds back."""
    own = "-XX:Tier4InvocationThreshold=5000 -Dapp.mode=weekly"
    options = driver_options(SparkSettings(master="local[2]", conf={"spark.driver.extraJavaOptions": own}), tmp_path)
    assert options.index("-XX:Tier4InvocationThreshold=150000") < options.index("-XX:Tier4InvocationThreshold=5000")
    assert "-Dapp.mode=weekly" in options
    # the executors' options are the cluster's concern: only the driver's change
    conf = session_conf(SparkBackend(SparkSettings(master="local[2]"), tmp_path))
    assert "Tier4" not in conf["spark.executor.extraJavaOptions"]


def test_a_run_creates_the_spark_backend_its_settings_name(tmp_path):
    """The backend module is imported only when a run creates an engine: classic Spark or Spark Connect,
    as the settings say (neither starts a JVM or a session here)."""
    from hybridflow import backends
    from hybridflow.backends.spark.connect import SparkConnectBackend

    classic = backends.create("spark", SparkSettings(master="local[2]"), tmp_path)
    connect = backends.create("spark", SparkSettings(remote="sc://127.0.0.1:15002"), tmp_path)
    assert type(classic) is SparkBackend and classic.session is None
    assert type(connect) is SparkConnectBackend and str(connect.master) == "sc://127.0.0.1:15002"
