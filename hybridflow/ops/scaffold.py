"""`hybridflow init`: a new project that validates and runs at once. A small CSV of events goes
through one stage per chosen engine, each in its own module with a typed signature (each engine
declares its example stage: see backends.Engine.example), plus a test that runs the pipeline and a
README that says how."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UsageError
from ..installing import install_extras

SAMPLE = "event_id,customer_id,amount,kind\n" + "".join(
    f"{i},{100 + i % 5},{(i * 37) % 200 / 4:.2f},{'purchase' if i % 3 else 'refund'}\n" for i in range(1, 41))


def offered() -> dict:
    """The engines init can write a stage for (each declares its own example), in registry order."""
    from ..engines import engines

    return {name: engine for name, engine in engines().items() if engine.example}

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
    """Write the project into `directory` (new, or empty); returns the files written. The default
    engine (in-process) always cleans the sample first, whatever else runs."""
    from ..engines import DEFAULT

    known = offered()
    unknown = [e for e in engines if e not in known]
    if unknown or not engines:
        raise UsageError(f"--engines takes some of {', '.join(known)}, not '{','.join(unknown) or 'nothing'}'")
    if directory.exists() and any(directory.iterdir()):
        raise UsageError(f"{directory} is not empty", hint="give a new directory: hybridflow init my-pipeline")
    chosen = [DEFAULT] + [e for e in known if e in engines and e != DEFAULT]
    examples = {name: known[name].example for name in chosen}
    name = re.sub(r"[^A-Za-z0-9_-]", "-", directory.resolve().name).strip("-_") or "pipeline"
    files = {
        "data/events.csv": SAMPLE,
        "stages/__init__.py": "",
        "pipeline.yaml": _pipeline(name, chosen, examples),
        "tests/test_pipeline.py": TEST.replace("{last}", examples[chosen[-1]][1]),
        "README.md": _readme(name, chosen, examples, [known[e].extra for e in chosen if known[e].extra]),
    }
    inputs = ["events"] + [examples[engine][1] for engine in chosen]  # each stage reads the one before
    files.update({f"stages/{engine}_stage.py": examples[engine][0].replace("{input}", inputs[i])
                  for i, engine in enumerate(chosen)})
    written = []
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _pipeline(name: str, engines: list[str], examples: dict[str, tuple[str, str]]) -> str:
    lines = ["# hybridflow run pipeline.yaml   (hybridflow validate pipeline.yaml checks it)", f"name: {name}",
             "", "params:", "  min_amount: 10.0", "", "datasets:", "  events:", "    path: data/events.csv",
             "    format: csv", "    schema: {event_id: int64, customer_id: int64, amount: double, kind: string}",
             "", "stages:"]
    previous = "events"
    for engine in engines:
        function = examples[engine][1]
        lines.append(f"  {function}:")
        lines.append(f"    backend: {engine}")
        lines.append(f"    run: stages.{engine}_stage:{function}")
        lines.append(f"    inputs: [{previous}]")
        lines.append(f"    outputs: [{function}]")
        previous = function
    return "\n".join(lines) + "\n"


def _readme(name: str, engines: list[str], examples: dict[str, tuple[str, str]], extras: list[str]) -> str:
    chain = " -> ".join(f"{examples[e][1]} ({e})" for e in engines)
    extras = ",".join(extras)
    install = install_extras(extras)
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
