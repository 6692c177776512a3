"""The pipeline's secrets kept out of what Spark records: conf that makes Spark redact them wherever it
records conf or writes out plans, and this application's local event log rewritten without them once
the session has stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Spark's own default: conf keys (or values) matching it show as *********(redacted) in the UI,
# event logs and its own logs.
SPARK_REDACTION_DEFAULT = r"(?i)secret|password|token|access[.]key"


def redaction_conf(conf: dict[str, str], secrets) -> dict[str, str]:
    """Conf that makes Spark redact the pipeline's secret values wherever it records conf (the event
    log a user turns on, the UI's environment page, its logs) and in the plans and options it writes
    out (a secret in a read option, a SQL string). Spark redacts an entry whose key or value matches
    spark.redaction.regex, so the values themselves are added to it, quoted."""
    if not secrets:
        return {}
    values = "|".join(r"\Q" + value.replace(r"\E", r"\E\\E\Q") + r"\E"
                      for value in sorted(secrets, key=len, reverse=True))
    keys = conf.get("spark.redaction.regex", SPARK_REDACTION_DEFAULT)
    strings = conf.get("spark.redaction.string.regex")
    return {"spark.redaction.regex": f"{keys}|{values}",
            "spark.redaction.string.regex": f"{strings}|{values}" if strings else values}


def local_event_logs(context) -> tuple[Path, str] | None:
    """Where this application's event log goes, when it is on and local: (directory, app id)."""
    conf = context.getConf()
    if conf.get("spark.eventLog.enabled", "false").lower() != "true":
        return None
    where = conf.get("spark.eventLog.dir", "/tmp/spark-events")
    if "://" in where and not where.startswith("file:"):
        return None  # HDFS, S3: not ours to rewrite
    return Path(where.removeprefix("file://").removeprefix("file:")), context.applicationId


def redact_event_logs(directory: Path, app_id: str, secrets) -> None:
    """Spark redacts conf values (see redaction_conf) but not what a failed task's error or a query
    plan quotes; an uncompressed event log of this application is rewritten with the secrets
    replaced, atomically. A compressed one is left as it is (the README says so)."""
    from ...definition.pipeline import REDACTED

    needles = sorted({v for value in secrets for v in (value, json.dumps(value)[1:-1])}, key=len, reverse=True)
    for path in sorted(directory.glob(f"*{app_id}*")):
        for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            if file.suffix in (".zstd", ".lz4", ".snappy", ".lzf"):
                continue
            data = original = file.read_bytes()
            for needle in needles:
                data = data.replace(needle.encode(), REDACTED.encode())
            if data != original:
                partial = file.with_name(f".{file.name}.redacting")
                partial.write_bytes(data)
                os.chmod(partial, file.stat().st_mode & 0o777)
                os.replace(partial, file)
