"""Faults between an S3 client and the local gateway (testbeds/ceph_s3.py): an HTTP proxy the tests put
in front of the server's endpoint, which answers chosen requests itself (503 SlowDown, as S3 throttles) or runs an
action first (kill the gateway, suspend the user) and then forwards the request as usual. Every other request
passes through unchanged, signed headers included. It counts what it did, so a test can compare the faults it
injected with what the harness's summary says it saw.

    with FaultProxy(server.endpoint_url) as proxy:
        proxy.on(lambda r: "/global_step4/" in r.path and "partNumber=" in r.path, before=kill_gateway, times=1)
        proxy.on(lambda r: "/global_step" in r.path, respond=SLOW_DOWN, every=4)
        ... run with AWS_ENDPOINT_URL=proxy.url ...

Requests and responses are buffered whole (a part is at most the client's part size, 8 MiB), which is all a test
needs; the server's own streaming proxy is third_party/rgw_multipart_etag.py.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

SLOW_DOWN = (503, "SlowDown", "Please reduce your request rate.")


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # with the query: /bucket/key?partNumber=1&uploadId=...


@dataclass
class Rule:
    when: Callable[[Request], bool]
    respond: tuple[int, str, str] | None = None  # status, S3 error code, message: answered here, never forwarded
    before: Callable[[], None] | None = None  # run, then forward (a request to a killed gateway then fails)
    fail: bool = False  # after `before`: close the connection without an answer instead of forwarding
    every: int = 1  # act on every n-th matching request (1: each)
    times: int | None = None  # act at most this often
    matched: int = 0
    acted: int = 0


@dataclass
class FaultProxy:
    upstream: str  # http://host:port of the server's endpoint
    rules: list[Rule] = field(default_factory=list)
    forwarded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _hooks_running: int = 0
    _hooks_idle: threading.Condition = field(default_factory=threading.Condition)

    def on(self, when: Callable[[Request], bool], **action) -> Rule:
        rule = Rule(when, **action)
        with self._lock:
            self.rules.append(rule)
        return rule

    def _hook(self, before: Callable[[], None]) -> None:
        with self._hooks_idle:
            self._hooks_running += 1
        try:
            before()
        finally:
            with self._hooks_idle:
                self._hooks_running -= 1
                self._hooks_idle.notify_all()

    def wait_for_hooks(self, timeout: float = 120) -> None:
        """Return once no rule's `before` runs: a run can fail (another rank's request refused) while the hook that
        made it fail still runs, and undoing the fault before the hook ends would race it."""
        with self._hooks_idle:
            if not self._hooks_idle.wait_for(lambda: self._hooks_running == 0, timeout):
                raise TimeoutError(f"a proxy rule's hook still runs after {timeout} s")

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> Self:
        proxy, target = self, urllib.parse.urlsplit(self.upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass

            def handle_one(self):
                body = self._body()
                rule = proxy._decide(Request(self.command, self.path))
                if rule is not None and rule.respond is not None:
                    return self._error(*rule.respond)
                if rule is not None and rule.before is not None:
                    proxy._hook(rule.before)
                    if rule.fail:
                        self.close_connection = True
                        return None
                try:
                    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "transfer-encoding")}
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST")
                                 else None, headers=headers)
                    response = conn.getresponse()
                    payload = response.read()
                    conn.close()
                except OSError:  # the server is gone: so is our answer, as from a load balancer that lost it
                    self.close_connection = True
                    return None
                with proxy._lock:
                    proxy.forwarded += 1
                self.send_response_only(response.status, response.reason)
                for name, value in response.getheaders():  # a HEAD's Content-Length is the object's: kept
                    if name.lower() not in ("transfer-encoding", "connection") and not (
                            name.lower() == "content-length" and self.command != "HEAD"):
                        self.send_header(name, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                return None

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    data = bytearray()
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        data += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _error(self, status: int, code: str, message: str) -> None:
                xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}'
                       f'</Message><Resource>{self.path}</Resource></Error>').encode()
                self.send_response_only(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(xml)))
                self.end_headers()
                if self.command != "HEAD":  # a HEAD's answer has no body
                    self.wfile.write(xml)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_one

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _decide(self, request: Request) -> Rule | None:
        """The first rule that acts on this request (its counters updated), or None: forward it."""
        with self._lock:
            for rule in self.rules:
                if not rule.when(request) or (rule.times is not None and rule.acted >= rule.times):
                    continue
                rule.matched += 1
                if rule.matched % rule.every:
                    continue
                rule.acted += 1
                return rule
        return None
