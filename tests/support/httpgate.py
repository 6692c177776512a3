"""An HTTP proxy on 127.0.0.1, in a thread of the test process, that holds the requests a test names
until it opens: a tracker that is slow to answer one call (a model's registration), as a loaded
server or a long upload is. Every other request is forwarded at once."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

HOP_BY_HOP = ("connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade")


class HttpGate:
    def __init__(self, upstream: str, holds: Callable[[str, str], bool]) -> None:
        """`holds(method, path)`: whether a request waits for open()."""
        self.upstream = urlsplit(upstream)
        self.holds = holds
        self.opened = threading.Event()
        self.held: list[str] = []  # "METHOD path" of each request held
        self.holding = threading.Event()  # set once a request is held
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def open(self) -> None:
        """Forward what is held, and every request from now on."""
        self.opened.set()

    def close(self) -> None:
        self.opened.set()
        self.server.shutdown()
        self.server.server_close()

    def forward(self, request: BaseHTTPRequestHandler) -> None:
        if self.holds(request.command, request.path) and not self.opened.is_set():
            self.held.append(f"{request.command} {request.path}")
            self.holding.set()
            self.opened.wait()
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=120)
        try:
            upstream.request(request.command, request.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
            request.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    request.send_header(key, value)
            request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            request.wfile.write(data)
        finally:
            upstream.close()


def _handler(gate: HttpGate):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # the tests' output stays theirs
            pass

        def do_GET(self) -> None:
            gate.forward(self)

        do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    return Handler
