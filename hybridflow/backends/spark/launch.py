"""The driver JVM's start and end in this process: conf holding a secret handed over in a private
properties file instead of the command line, SPARK_LOCAL_IP while it launches, pyspark's own
query-context log records sent to engines.log, and the accumulator server shut down aside so a stop
does not wait for it."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import tempfile
import threading
from pathlib import Path

from ..engineoutput import engine_output_stream


@contextlib.contextmanager
def submitted_privately(conf: dict[str, str], scratch: Path):
    """Conf holding a secret reaches the JVM through a properties file readable by the owner only,
    removed once the JVM has read it at launch, instead of through the command line (world-readable
    in /proc) where pyspark puts every other conf entry."""
    if not conf:
        yield
        return
    scratch.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix="spark-conf-", suffix=".properties", dir=scratch)  # 0600
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.writelines(f"{_property(key, True)}={_property(value, False)}\n" for key, value in conf.items())
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    try:
        with _environment("PYSPARK_SUBMIT_ARGS",
                          f"--properties-file {shlex.quote(path)} {previous or 'pyspark-shell'}"):
            yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _property(text: str, is_key: bool) -> str:
    """`text` escaped for a Java properties file (Spark reads it as UTF-8)."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if is_key:
        return text.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    return "\\" + text if text.startswith(" ") else text


# pyspark 4 logs the query context of a failed DataFrame or SQL operation (DIVIDE_BY_ZERO at a line
# of the stage) as a JSON record from this process, on a handler of its own bound to the stderr of
# the moment the logger was made: the terminal, when the write of the stage's output fails
QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def route_query_context_logs():
    """Those loggers write to engines.log instead: to a copy of this process's stderr taken now,
    during the start, while it points there. Returns what undoes it."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # pyspark before 4 logs no such records
        return lambda: None
    sink = engine_output_stream()
    handler = logging.StreamHandler(sink)
    # PySparkLogger.getLogger swaps the class of new loggers process-wide for a moment: a logger an
    # engine starting beside this one made meanwhile would be a PySparkLogger too, printing JSON.
    # logging's own lock, which every getLogger takes, keeps the other threads out for that moment.
    with logging._lock:
        loggers = [PySparkLogger.getLogger(name) for name in QUERY_CONTEXT_LOGGERS]
    # pyspark's own handler (bound to the stderr of the moment); others that a caller put there stay
    saved = [[h for h in logger.handlers if type(h) is logging.StreamHandler] for logger in loggers]
    for logger, handlers in zip(loggers, saved):
        for old in handlers:
            logger.removeHandler(old)
        logger.addHandler(handler)  # PySparkLogger's addHandler gives it pyspark's JSON format
        logger.propagate = False

    def undo() -> None:
        for logger, handlers in zip(loggers, saved):
            logger.removeHandler(handler)
            for old in handlers:
                logger.addHandler(old)
        sink.close()

    return undo


def end_accumulator_server_aside(context) -> None:
    """Shut pyspark's accumulator server down in a thread of its own, so that stopping the session
    does not wait for it: its loop polls every 0.5 s, and that wait was most of a Spark stop (0.5 s
    against 0.06 s for the JVM's own), on the run's critical path when Spark stops early."""
    server = getattr(context, "_accumulatorServer", None)  # private: where it is not, stop() does it all
    if server is None:
        return
    context._accumulatorServer = None  # SparkContext.stop() skips what it finds None
    # The JVM ends beside it: a worker's connection cut mid-read is expected then, and
    # socketserver would print its traceback to the terminal
    server.server_shutdown = True
    server.handle_error = lambda request, client_address: None
    threading.Thread(target=server.shutdown, daemon=True, name="hybridflow-spark-accumulators-stop").start()


@contextlib.contextmanager
def local_ip(address: str | None):
    """SPARK_LOCAL_IP is `address` while the driver's JVM is launched (None: left as it is)."""
    if address is None:
        yield
        return
    with _environment("SPARK_LOCAL_IP", address):
        yield


@contextlib.contextmanager
def _environment(name: str, value: str):
    """This process's environment variable `name` is `value` while the block runs, then what it was."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
