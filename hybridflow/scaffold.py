"""`hybridflow init`: a new project that validates and runs at once. A small CSV of events goes
through one stage per chosen engine (python cleans, Spark adds a column, Dask adds features, Ray
scores), each in its own module with a typed signature, plus a test that runs the pipeline and a
README that says how."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import UsageError

ORDER = ("python", "spark", "dask", "ray")

SAMPLE = "event_id,customer_id,amount,kind\n" + "".join(
    f"{i},{100 + i % 5},{(i * 37) % 200 / 4:.2f},{'purchase' if i % 3 else 'refund'}\n" for i in range(1, 41))

PYTHON_STAGE = '''"""Cleaning on the python backend: a pandas DataFrame in, a pandas DataFrame out."""

import pandas as pd


def clean({input}: pd.DataFrame, min_amount: float) -> pd.DataFrame:
    """Keep purchases of at least `min_amount` (a param in pipeline.yaml)."""
    kept = {input}[({input}["kind"] == "purchase") & ({input}["amount"] >= min_amount)]
    return kept.reset_index(drop=True)
'''

SPARK_STAGE = '''"""Column work on Spark: a Spark DataFrame in and out (a `ctx` parameter would give the session)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def in_cents({input}: DataFrame) -> DataFrame:
    return {input}.withColumn("amount_cents", F.round(F.col("amount") * 100).cast("long"))
'''

DASK_STAGE = '''"""Features on Dask: a dask DataFrame in and out (computed when hybridflow writes it)."""

import dask.dataframe as dd


def features({input}: dd.DataFrame) -> dd.DataFrame:
    return {input}.assign(big_spender={input}["amount"] > {input}["amount"].mean())
'''

RAY_STAGE = '''"""Scoring on Ray: a ray.data.Dataset in and out, scored in parallel batches."""

import pandas as pd
import ray.data


def score({input}: ray.data.Dataset) -> ray.data.Dataset:
    def add_score(batch: pd.DataFrame) -> pd.DataFrame:
        return batch.assign(score=batch["amount"] / 50.0)

    return {input}.map_batches(add_score, batch_format="pandas")
'''

# each engine's stage: its module (where {input} is the dataset it reads) and the function, which
# names the dataset it writes
STAGES = {"python": (PYTHON_STAGE, "clean"), "spark": (SPARK_STAGE, "in_cents"),
          "dask": (DASK_STAGE, "features"), "ray": (RAY_STAGE, "score")}

TEST = '''"""Runs the whole pipeline through hybridflow's Python API: `python -m pytest tests`."""

from pathlib import Path

import hybridflow

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline.yaml"


def test_the_pipeline_runs_and_publishes_its_last_output():
    result = hybridflow.run(PIPELINE, force=True)
    result.raise_for_status()
    last = hybridflow.read(PIPELINE, "{last}")
    assert len(last) > 0
'''


def create(directory: Path, engines: list[str]) -> list[Path]:
    """Write the project into `directory` (new, or empty); returns the files written."""
    unknown = [e for e in engines if e not in ORDER]
    if unknown or not engines:
        raise UsageError(f"--engines takes some of {', '.join(ORDER)}, not '{','.join(unknown) or 'nothing'}'")
    if directory.exists() and any(directory.iterdir()):
        raise UsageError(f"{directory} is not empty", hint="give a new directory: hybridflow init my-pipeline")
    chosen = [e for e in ORDER if e in engines]
    if "python" not in chosen:
        chosen.insert(0, "python")  # the CSV is cleaned in-process first, whatever else runs
    name = re.sub(r"[^A-Za-z0-9_-]", "-", directory.resolve().name).strip("-_") or "pipeline"
    files = {
        "data/events.csv": SAMPLE,
        "stages/__init__.py": "",
        "pipeline.yaml": _pipeline(name, chosen),
        "tests/test_pipeline.py": TEST.replace("{last}", STAGES[chosen[-1]][1]),
        "README.md": _readme(name, chosen),
    }
    inputs = ["events"] + [STAGES[engine][1] for engine in chosen]  # each stage reads the one before
    files.update({f"stages/{engine}_stage.py": STAGES[engine][0].replace("{input}", inputs[i])
                  for i, engine in enumerate(chosen)})
    written = []
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _pipeline(name: str, engines: list[str]) -> str:
    lines = ["# hybridflow run pipeline.yaml   (hybridflow validate pipeline.yaml checks it)", f"name: {name}",
             "", "params:", "  min_amount: 10.0", "", "datasets:", "  events:", "    path: data/events.csv",
             "    format: csv", "    schema: {event_id: int64, customer_id: int64, amount: double, kind: string}",
             "", "stages:"]
    previous = "events"
    for engine in engines:
        function = STAGES[engine][1]
        lines.append(f"  {function}:")
        lines.append(f"    backend: {engine}")
        lines.append(f"    run: stages.{engine}_stage:{function}")
        lines.append(f"    inputs: [{previous}]")
        lines.append(f"    outputs: [{function}]")
        previous = function
    return "\n".join(lines) + "\n"


def _readme(name: str, engines: list[str]) -> str:
    chain = " -> ".join(f"{STAGES[e][1]} ({e})" for e in engines)
    extras = ",".join(e for e in engines if e != "python")
    install = f"pip install 'hybridflow[{extras}]'" if extras else "pip install hybridflow"
    return f"""# {name}

A hybridflow pipeline: `data/events.csv` -> {chain}.

```bash
{install}
hybridflow validate pipeline.yaml     # every problem, as file:line:col
hybridflow run pipeline.yaml          # runs what changed; a second run skips everything
hybridflow report                     # the last run as one HTML file
python -m pytest tests                # runs the pipeline through hybridflow's Python API
```

Each stage is a function in `stages/`; `pipeline.yaml` names its engine, its inputs, its outputs
and its params. Outputs are published under `.hybridflow/{name}/datasets/`.
"""
