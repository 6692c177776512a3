"""The backend contract (hybridflow.testing.BackendContract) on embedded Spark: every type, odd names,
empty and partitioned outputs handed off with the python engine each way and with itself. What Spark
documents it cannot hold (unsigned integers, column names that differ only by case) is refused on read
naming the column, and named by its Engine.unrepresentable for validate."""

from __future__ import annotations

import pyarrow as pa

from hybridflow.testing import BackendContract
from tests.support.engines import TEST_SETTINGS


class TestSparkContract(BackendContract):
    engine = "spark"
    settings = TEST_SETTINGS["spark"]
    refused = {
        "uint32": (pa.table({"count": pa.array([1], pa.uint32())}), "column 'count': Spark has no uint32 type"),
        "names-differing-by-case": (pa.table({"a": [1], "A": [2]}), "columns 'a' and 'A' differ only by case"),
    }

    def test_the_driver_jvm_runs_with_hybridflows_jit_thresholds(self, backend):
        """The options reach the JVM pyspark launches (HotSpot's own view of its flags)."""
        jvm = backend.session.sparkContext._jvm
        bean_class = jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
        hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(bean_class)
        assert hotspot.getVMOption("Tier4InvocationThreshold").getValue() == "150000"
        assert hotspot.getVMOption("Tier4BackEdgeThreshold").getValue() == "1200000"
