"""A fault-injecting HTTP proxy in front of a test S3 server (moto), on 127.0.0.1 in a thread of the
test process: it forwards every request and keeps a log of them (method, path, query), and can break
the store in the ways real stores and gateways break it.

- `strip_conditions`: If-None-Match and If-Match are removed before forwarding, as by a store (or a
  gateway before it) that ignores conditional writes. The request's signature then no longer
  matches: put it in front of a moto server that does not check signatures (S3Server(authenticate=False)).
- `refuse_deleting`: keys holding this text are taken out of each DeleteObjects request and answered
  with an AccessDenied error each, as a store answers a batch delete that fails for some keys.
- `refuse_checksums`: a write carrying the flexible checksums newer AWS SDKs send by default (an
  x-amz-checksum-* header, or a body in aws-chunked encoding with a trailing checksum) is refused with
  400, and so is a DeleteObjects without Content-MD5: what stores that predate those checksums answer.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

CONDITIONS = ("if-none-match", "if-match")
HOP_BY_HOP = ("connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade")


class S3Proxy:
    def __init__(self, upstream: str, *, strip_conditions: bool = False, refuse_deleting: str | None = None,
                 refuse_checksums: bool = False) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.strip_conditions, self.refuse_deleting = strip_conditions, refuse_deleting
        self.refuse_checksums = refuse_checksums
        self.refused: list[tuple[str, str, str]] = []  # (method, path, why) of each request answered 400
        self.requests: list[tuple[str, str, str]] = []  # (method, path, query) of each request forwarded
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> S3Proxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def env(self, server) -> dict[str, str]:
        """The server's AWS variables, pointed at this proxy."""
        return {**server.env(), "AWS_ENDPOINT_URL": self.endpoint}

    def requested(self, method: str, path_holding: str) -> list[tuple[str, str, str]]:
        return [r for r in self.requests if r[0] == method and path_holding in r[1]]

    # what is done to a request and its answer

    def _refusal(self, method: str, query: str, headers: dict[str, str]) -> str | None:
        """Why the request is refused without reaching the store (None: it is forwarded)."""
        if not self.refuse_checksums or method not in ("PUT", "POST"):
            return None
        named = {k.lower(): v for k, v in headers.items()}
        if re.search(r"(^|&)delete(=|&|$)", query):
            return None if "content-md5" in named else "Missing required header for this request: Content-MD5"
        if any(k.startswith(("x-amz-checksum-", "x-amz-sdk-checksum")) for k in named) \
                or "aws-chunked" in named.get("content-encoding", "") \
                or named.get("x-amz-content-sha256", "").startswith("STREAMING-"):
            return "x-amz-checksum and aws-chunked trailers are not supported"
        return None

    def _edit_request(self, method: str, query: str, headers: dict[str, str], body: bytes):
        if self.strip_conditions:
            headers = {k: v for k, v in headers.items() if k.lower() not in CONDITIONS}
        refused: list[str] = []
        if self.refuse_deleting and method == "POST" and re.search(r"(^|&)delete(=|&|$)", query):
            body, refused = _without_keys(body, self.refuse_deleting)
            stale = ("x-amz-checksum", "x-amz-sdk-checksum", "content-md5", "content-length")  # of the old body
            headers = {k: v for k, v in headers.items() if not k.lower().startswith(stale)}
            headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        return headers, body, refused


def _without_keys(body: bytes, holding: str) -> tuple[bytes, list[str]]:
    text = body.decode()
    refused = [key for key in re.findall(r"<Object><Key>(.*?)</Key>", text) if holding in key]
    for key in refused:
        text = re.sub(rf"<Object><Key>{re.escape(key)}</Key>.*?</Object>", "", text, count=1)
    return text.encode(), refused


def _with_errors(body: bytes, refused: list[str]) -> bytes:
    errors = "".join(f"<Error><Key>{key}</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
                     for key in refused)
    text = body.decode()
    return (text.replace("</DeleteResult>", errors + "</DeleteResult>") if "</DeleteResult>" in text
            else text).encode()


def _dechunked(stream) -> bytes:
    chunks = []
    while True:
        size = int(stream.readline().split(b";")[0].strip(), 16)
        if size == 0:
            while stream.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        chunks.append(stream.read(size))
        stream.readline()


def _body(headers, stream) -> bytes:
    if headers.get("Transfer-Encoding", "").lower() == "chunked":
        return _dechunked(stream)
    return stream.read(int(headers.get("Content-Length") or 0))


def _handler(proxy: S3Proxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # the tests' output stays theirs
            pass

        def _forward(self) -> None:
            path, _, query = self.path.partition("?")
            body = _body(self.headers, self.rfile)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            why = proxy._refusal(self.command, query, headers)
            if why:
                proxy.refused.append((self.command, path, why))
                return self._answer(400, "Bad Request", [("Content-Type", "application/xml")],
                                    f"<Error><Code>InvalidArgument</Code><Message>{why}</Message></Error>".encode())
            headers, body, refused = proxy._edit_request(self.command, query, headers, body)
            proxy.requests.append((self.command, path, query))
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers["Content-Length"] = str(len(body))
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                if refused and answer.status == 200:
                    data = _with_errors(data, refused)
                self._answer(answer.status, answer.reason, answer.getheaders(), data)
            finally:
                upstream.close()

        def _answer(self, status: int, reason: str, headers, data: bytes) -> None:
            self.send_response(status, reason)
            length = str(len(data))
            for name, value in headers:
                if name.lower() == "content-length" and self.command == "HEAD":
                    length = value  # the object's size: a HEAD answer has no body to measure
                elif name.lower() not in HOP_BY_HOP + ("content-length",):
                    self.send_header(name, value)
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler
