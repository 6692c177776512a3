"""A fault-injecting HTTP proxy in front of a test S3 server, on 127.0.0.1 in a thread of the test
process: it forwards every request and keeps a log of them (method, path, query), and breaks the store
in the ways real stores, gateways and networks break it.

- `strip_conditions`: If-None-Match and If-Match are removed before forwarding, as by a store (or a
  gateway before it) that ignores conditional writes. The request's signature then no longer
  matches: put it in front of a moto server that does not check signatures (S3Server(authenticate=False)).
- `refuse_deleting`: keys holding this text are taken out of each DeleteObjects request and answered
  with an AccessDenied error each, as a store answers a batch delete that fails for some keys.
- `refuse_checksums`: a write carrying the flexible checksums newer AWS SDKs send by default (an
  x-amz-checksum-* header, or a body in aws-chunked encoding with a trailing checksum) is refused with
  400, and so is a DeleteObjects without Content-MD5: what stores that predate those checksums answer.
- `drop_answer(matches)`: the answer to a matching request is lost after the server acted on it, as a
  network that loses a response does; the client then retries what was already done.

A request the proxy does not edit is forwarded exactly as it came (headers, signature, chunks).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

CONDITIONS = ("if-none-match", "if-match")
HOP_BY_HOP = ("connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade")


@dataclass
class Rule:
    matches: Callable[[str, str, dict[str, str]], bool]  # (method, path, headers in lower case)
    times: int = 1  # how many matching requests lose their answer
    dropped: list[str] = field(default_factory=list)  # "METHOD path" of each one whose answer was dropped


def conditional_put(key_suffix: str) -> Callable[[str, str, dict[str, str]], bool]:
    """A PUT of an object whose key ends with `key_suffix`, made with If-Match or If-None-Match."""
    return lambda method, path, headers: (method == "PUT" and urlsplit(path).path.endswith(key_suffix)
                                          and any(condition in headers for condition in CONDITIONS))


class S3Proxy:
    def __init__(self, upstream: str, *, strip_conditions: bool = False, refuse_deleting: str | None = None,
                 refuse_checksums: bool = False) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.strip_conditions, self.refuse_deleting = strip_conditions, refuse_deleting
        self.refuse_checksums = refuse_checksums
        self.refused: list[tuple[str, str, str]] = []  # (method, path, why) of each request answered 400
        self.requests: list[tuple[str, str, str]] = []  # (method, path, query) of each request forwarded
        self.rules: list[Rule] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)

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

    def _forward(self, request: BaseHTTPRequestHandler) -> None:
        path, _, query = request.path.partition("?")
        lowered = {name.lower(): value for name, value in request.headers.items()}
        raw = _raw_body(request, lowered)
        why = self._refusal(request.command, query, lowered)
        if why:
            self.refused.append((request.command, path, why))
            data = f"<Error><Code>InvalidArgument</Code><Message>{why}</Message></Error>".encode()
            request.send_response_only(400, "Bad Request")
            request.send_header("Content-Type", "application/xml")
            request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            request.wfile.write(data)
            return
        headers, body, refused = self._edit_request(request.command, query, list(request.headers.items()), raw,
                                                    lowered.get("transfer-encoding", "").lower() == "chunked")
        self.requests.append((request.command, path, query))
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.putrequest(request.command, request.path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                upstream.putheader(name, value)
            upstream.endheaders(body or None)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        if refused and answer.status == 200:
            data = _with_errors(data, refused)
        if self._dropping(request.command, request.path, lowered) is not None:
            # the server did it; the client never hears: the connection ends with no answer
            request.close_connection = True
            request.connection.shutdown(socket.SHUT_RDWR)
            return
        request.send_response_only(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP + ("content-length",):
                request.send_header(name, value)
        length = answer.getheader("Content-Length") if request.command == "HEAD" else str(len(data))
        request.send_header("Content-Length", length or "0")
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(data)

    def _refusal(self, method: str, query: str, headers: dict[str, str]) -> str | None:
        """Why the request is refused without reaching the store (None: it is forwarded); `headers` in lower case."""
        if not self.refuse_checksums or method not in ("PUT", "POST"):
            return None
        if re.search(r"(^|&)delete(=|&|$)", query):
            return None if "content-md5" in headers else "Missing required header for this request: Content-MD5"
        if any(k.startswith(("x-amz-checksum-", "x-amz-sdk-checksum")) for k in headers) \
                or "aws-chunked" in headers.get("content-encoding", "") \
                or headers.get("x-amz-content-sha256", "").startswith("STREAMING-"):
            return "x-amz-checksum and aws-chunked trailers are not supported"
        return None

    def _edit_request(self, method: str, query: str, headers: list[tuple[str, str]], raw: bytes, chunked: bool):
        """(headers, body, keys refused): as they came unless a fault edits them; an edited body is
        sent whole, with its new length."""
        deleting = bool(self.refuse_deleting) and method == "POST" and re.search(r"(^|&)delete(=|&|$)", query)
        if not (self.strip_conditions or deleting):
            return headers, raw, []
        body = _dechunked(raw) if chunked else raw
        refused: list[str] = []
        dropped = HOP_BY_HOP + ("content-length",) + (CONDITIONS if self.strip_conditions else ())
        if deleting:
            body, refused = _without_keys(body, self.refuse_deleting)
            dropped += ("x-amz-checksum", "x-amz-sdk-checksum", "content-md5")  # of the old body
        kept = [(k, v) for k, v in headers if not k.lower().startswith(dropped)]
        if deleting:
            kept.append(("Content-MD5", base64.b64encode(hashlib.md5(body).digest()).decode()))
        return [*kept, ("Content-Length", str(len(body)))], body, refused


def _raw_body(request: BaseHTTPRequestHandler, headers: dict[str, str]) -> bytes:
    """The request's body as sent: by its length, or its chunks exactly as they came."""
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


def _dechunked(raw: bytes) -> bytes:
    chunks, at = [], 0
    while True:
        end = raw.index(b"\n", at)
        size = int(raw[at:end].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return b"".join(chunks)
        chunks.append(raw[end + 1:end + 1 + size])
        at = end + 1 + size + 2  # the chunk's CRLF


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


def _handler(proxy: S3Proxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # the tests' output stays theirs
            pass

        def _forward(self) -> None:
            proxy._forward(self)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler
