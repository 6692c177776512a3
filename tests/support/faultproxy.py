"""A fault-injecting HTTP proxy between hybridflow and a real S3 server: every request is forwarded
as it came (headers, signature and body untouched), and the answers of chosen requests are dropped
after the server has acted on them, as a network that loses a response does. The client then retries
a request the server already carried out: what a conditional write must survive.

Runs in the test's own process, in a thread; point a run at it with AWS_ENDPOINT_URL=proxy.endpoint.
"""

from __future__ import annotations

import http.client
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit


@dataclass
class Rule:
    matches: Callable[[str, str, dict[str, str]], bool]  # (method, path, headers in lower case)
    times: int = 1  # how many matching requests lose their answer
    dropped: list[str] = field(default_factory=list)  # "METHOD path" of each one whose answer was dropped


def conditional_put(key_suffix: str) -> Callable[[str, str, dict[str, str]], bool]:
    """A PUT of an object whose key ends with `key_suffix`, made with If-Match or If-None-Match."""
    return lambda method, path, headers: (method == "PUT" and urlsplit(path).path.endswith(key_suffix)
                                          and ("if-match" in headers or "if-none-match" in headers))


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.rules: list[Rule] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the test's output is for its assertions
                pass

            def _forward(self) -> None:
                proxy.forward(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def drop_answer(self, matches: Callable[[str, str, dict[str, str]], bool], times: int = 1) -> Rule:
        rule = Rule(matches, times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def _dropping(self, method: str, path: str, headers: dict[str, str]) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if len(rule.dropped) < rule.times and rule.matches(method, path, headers):
                    rule.dropped.append(f"{method} {path}")
                    return rule
        return None

    def forward(self, request: BaseHTTPRequestHandler) -> None:
        headers = {name.lower(): value for name, value in request.headers.items()}
        body = _body(request, headers)
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.putrequest(request.command, request.path, skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers.items():
                upstream.putheader(name, value)
            upstream.endheaders(body or None)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        if self._dropping(request.command, request.path, headers) is not None:
            # the server did it; the client never hears: the connection ends with no answer
            request.close_connection = True
            request.connection.shutdown(socket.SHUT_RDWR)
            return
        request.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                request.send_header(name, value)
        length = answer.getheader("Content-Length") if request.command == "HEAD" else str(len(data))
        request.send_header("Content-Length", length or "0")
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(data)


def _body(request: BaseHTTPRequestHandler, headers: dict[str, str]) -> bytes:
    """The request's body as sent: by its length, or its chunks exactly as they came (re-sent as they
    are, with the headers that announced them)."""
    if "content-length" in headers:
        return request.rfile.read(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() != "chunked":
        return b""
    raw = bytearray()
    while True:
        line = request.rfile.readline()
        raw += line
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then the empty line
                trailer = request.rfile.readline()
                raw += trailer
                if trailer in (b"\r\n", b"\n", b""):
                    return bytes(raw)
        raw += request.rfile.read(size + 2)
