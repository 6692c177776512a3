"""OpenLineage in tests: a receiver on 127.0.0.1 that keeps every event POSTed to it, and each event
checked against the specification's JSON schemas vendored in openlineage_spec/ (SOURCE.md): the
event against the core schema, and every facet against its own facet schema."""

from __future__ import annotations

import json
import threading
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource

SPEC = Path(__file__).with_name("openlineage_spec")
CORE_VERSIONS = ("1-0-1", "1-0-2", "2-0-2", "2-1-0")  # the core schema's URLs the facets refer to


FORMATS = FormatChecker()


@FORMATS.checks("uri")
def _is_uri(value: object) -> bool:  # jsonschema checks "uri" only with rfc3987 installed
    return not isinstance(value, str) or bool(urlsplit(value).scheme)


@cache
def _registry() -> tuple[Registry, dict]:
    core = json.loads((SPEC / "OpenLineage.json").read_text())
    resources = [(f"https://openlineage.io/spec/{v}/OpenLineage.json", Resource.from_contents(core))
                 for v in CORE_VERSIONS]
    facets = {}
    for file in sorted((SPEC / "facets").glob("*.json")):
        schema = json.loads(file.read_text())
        resources.append((schema["$id"], Resource.from_contents(schema)))
        facets[file.stem] = schema
    return Registry().with_resources(resources), facets


def _validator(schema: dict) -> Draft202012Validator:
    registry, _ = _registry()
    return Draft202012Validator(schema, registry=registry, format_checker=FORMATS)


def validate(event: dict) -> None:
    """Raise jsonschema's ValidationError for an event or a facet the specification refuses, and
    AssertionError for a facet with no vendored schema (every facet is checked)."""
    registry, facets = _registry()
    core = json.loads((SPEC / "OpenLineage.json").read_text())
    _validator({"$ref": "https://openlineage.io/spec/2-1-0/OpenLineage.json#/$defs/RunEvent",
                "$defs": core["$defs"]}).validate(event)
    for facet in _facets(event):
        name = facet["_schemaURL"].rpartition("#/$defs/")[2]
        assert name in facets, f"no vendored schema for facet {name}"
        _validator({"$ref": f"{facets[name]['$id']}#/$defs/{name}"}).validate(facet)


def _facets(event: dict):
    yield from (event["run"].get("facets") or {}).values()
    yield from (event["job"].get("facets") or {}).values()
    for dataset in [*event.get("inputs", []), *event.get("outputs", [])]:
        yield from (dataset.get("facets") or {}).values()
        yield from (dataset.get("inputFacets") or {}).values()
        yield from (dataset.get("outputFacets") or {}).values()


class LineageReceiver:
    """An OpenLineage endpoint: keeps each POSTed event with the request's path and headers."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.requests: list[tuple[str, dict]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append((self.path, dict(self.headers)))
                receiver.events.append(json.loads(body))
                self.send_response(201)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
