"""A Maven repository served on 127.0.0.1 for the tests of Spark's s3a jars fetched on first need: files in
Maven's layout with their checksums, and the faults a test asks for."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BASE = "/maven2/"
PROJECT = """<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>{}</project>"""
GROUPS = {"hadoop-aws": "org.apache.hadoop", "bundle": "software.amazon.awssdk",
          "analyticsaccelerator-s3": "software.amazon.s3.analyticsaccelerator"}


class MavenServer(ThreadingHTTPServer):
    """A Maven repository under /maven2/ on 127.0.0.1, with the faults a test asks for: `drops[path]`
    times the body of `path` is cut off half way, `holds[path]` an event its answer waits for."""

    daemon_threads = True

    def __init__(self, files: dict[str, bytes], auth: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), MavenHandler)
        self.files = files  # path under /maven2/ -> its bytes
        self.auth = auth
        self.drops: dict[str, int] = {}
        self.holds: dict[str, threading.Event] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.asked = threading.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{BASE}"

    def downloads(self) -> list[str]:
        return [path for path, _ in self.requests if path.endswith(".jar")]


class MavenHandler(BaseHTTPRequestHandler):
    server: MavenServer

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.removeprefix(BASE)
        with self.server.asked:
            self.server.requests.append((path, self.headers.get("Range")))
            self.server.asked.notify_all()
        if self.server.auth is not None and self.headers.get("Authorization") != self.server.auth:
            return self.send_error(401)
        if path not in self.server.files:
            return self.send_error(404)
        if path in self.server.holds:
            self.server.holds[path].wait(30)
        data = self.server.files[path]
        start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-")) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if self.server.drops.get(path, 0) > 0:
            self.server.drops[path] -= 1
            self.wfile.write(data[start:start + (len(data) - start) // 2])
            return  # HTTP/1.0: the connection closes with half the body sent
        self.wfile.write(data[start:])


@contextlib.contextmanager
def serving(files: dict[str, bytes], auth: str | None = None):
    server = MavenServer(files, auth)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def repository_of(jars: list[Path], hadoop: str) -> dict[str, bytes]:
    """A repository holding these jars (hadoop-aws, the AWS SDK bundle, the analytics accelerator, as a
    fetch put them in a cache) under a hadoop-aws POM of version `hadoop` that depends on exactly them."""
    files, dependencies = {}, []
    for jar in jars:
        artifact, version = jar.stem.rsplit("-", 1)
        group = GROUPS[artifact]
        files[f"{group.replace('.', '/')}/{artifact}/{version}/{jar.name}"] = jar.read_bytes()
        if artifact != "hadoop-aws":
            dependencies.append(f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
                                f"<version>{version}</version></dependency>")
    pom = PROJECT.format(f"<groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId>"
                         f"<version>{hadoop}</version><dependencies>{''.join(dependencies)}</dependencies>")
    files[f"org/apache/hadoop/hadoop-aws/{hadoop}/hadoop-aws-{hadoop}.pom"] = pom.encode()
    return {**files, **{f"{path}.sha256": hashlib.sha256(data).hexdigest().encode() for path, data in files.items()}}
