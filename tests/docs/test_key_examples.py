"""Every key of the pipeline-file reference has an example (docs/reference/key-examples.yaml), and each
example is valid where it stands: put in its place in a small pipeline file, `hybridflow validate` finds no
error. So the reference's examples cannot rot when the model changes."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import yaml

import hybridflow
from tests.support.docblocks import DOCS, Block, Scratch

SPEC = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "_hooks" / "reference.py")
reference = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(reference)

# What each example is laid into: one stage, its output, and the names the paths' placeholders become
# (a dataset with a path is an external input, `events`; any other, the stage's output).
BASE = {"name": "key-example", "stages": {"step": {"run": "stages.docs_stub:step", "outputs": ["out"]}}}
PLACEHOLDERS = {"backends": "dask", "datasets": "out", "stages": "step"}  # <engine> / <name> under each
# What the rest of the file holds around a section's examples, as a reader of that section assumes it:
# the datasets a stage names, the cluster a host is in, the kind of dataset a model is logged from.
CONTEXT = {
    "stages.<name>": {"datasets": {"events": {"path": "data/events", "partition_by": ["week"]},
                                   "customers": {"path": "data/customers.parquet"},
                                   "out": {"partition_by": ["week"]}}},
    "backends.<engine>.cluster.hosts[]": {"backends": {"dask": {"cluster": {"provider": "ssh"}}}},
    "datasets.<name>.mlflow": {"datasets": {"out": {"kind": "files"}}},
}


def placed(path: str, example: dict) -> dict:
    """The base pipeline with `example` merged in as the contents of the key's parent section."""
    document = copy.deepcopy(BASE)
    parts = path.split(".")[:-1]
    _merge(document, CONTEXT.get(".".join(parts), {}))
    node = document
    for i, part in enumerate(parts):
        if part in ("<engine>", "<name>"):
            part = PLACEHOLDERS[parts[i - 1].removesuffix("[]")]
            if parts[i - 1] == "datasets" and "path" in example:
                part = "events"
        if part.endswith("[]"):  # a list of mappings: the example is its one item
            part = part.removesuffix("[]")
            node = node.setdefault(part, [{}])[0]
        else:
            node = node.setdefault(part, {})
    if not parts and "stages" in example:  # a whole stages: section replaces the base's stage
        document.pop("stages")
    _merge(node, example)
    return document


def _merge(into: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def test_every_key_of_the_reference_has_one_example_that_holds_it():
    examples = reference.key_examples()  # raises, naming them, on a missing, stale or malformed example
    assert set(examples) == set(reference.key_paths(hybridflow.schema()))


def test_every_example_validates_in_its_place(tmp_path):
    scratch = Scratch(tmp_path / "project")
    failures = []
    try:
        for n, (path, example) in enumerate(reference.key_examples().items()):
            file = scratch.root / f"key-{n}.yaml"
            file.write_text(yaml.safe_dump(placed(path, example), sort_keys=False))
            try:
                scratch.validate(file, Block(reference.KEY_EXAMPLES, n + 1, "yaml", file.read_text()))
            except AssertionError as problem:
                failures.append(f"{path}: {reference.flow(example)}\n  {problem}")
    finally:
        scratch.close()
    assert not failures, "\n".join(failures)


def test_a_wrong_example_fails_validation_naming_its_key(tmp_path):
    scratch = Scratch(tmp_path / "project")
    file = scratch.root / "wrong.yaml"
    file.write_text(yaml.safe_dump(placed("stages.<name>.retries", {"retries": "twice"})))
    with pytest.raises(AssertionError, match="retries"):
        scratch.validate(file, Block(reference.KEY_EXAMPLES, 1, "yaml", file.read_text()))
