"""Ceph 16.2.15's RADOS Gateway (Debian 12's `radosgw`) answers CompleteMultipartUpload with an empty
`<ETag></ETag>`; s3torchconnector 1.5.0 (its Rust client) always uploads with multipart uploads and then fails every
write with `Header "ETag" not found`. Reads work, and a HEAD of the completed object shows the right ETag.

This is a pass-through HTTP proxy placed in front of such a gateway by the local test server
(testbeds/ceph_s3.py) and only there: requests and their signed headers go through byte for byte;
in a CompleteMultipartUpload response an empty ETag is replaced by the one S3 defines for a multipart object (the
md5 of the parts' binary md5s, then `-<number of parts>`), computed from the part list in the request. Nothing else
is changed. A real S3 endpoint never goes through it.

Remove when the gateway fills the ETag itself: tests/test_s3.py::test_gateway_still_returns_an_empty_multipart_etag
fails then (it completes a multipart upload directly against radosgw, without this proxy).

    python -m third_party.rgw_multipart_etag --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT2
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ADDRESSES = "ceph radosgw 16.2.15 with s3torchconnector==1.5.0"
BLOCK = 1 << 20
_PART_ETAG = re.compile(rb"<ETag>\s*(?:&quot;|\")?([0-9a-fA-F]{32})(?:&quot;|\")?\s*</ETag>")
_EMPTY_ETAG = re.compile(rb"<ETag>\s*</ETag>")


def multipart_etag(complete_request_body: bytes) -> str | None:
    """S3's ETag of a multipart object from a CompleteMultipartUpload request body (its parts' ETags, in order)."""
    parts = _PART_ETAG.findall(complete_request_body)
    if not parts:
        return None
    digest = hashlib.md5(b"".join(bytes.fromhex(p.decode()) for p in parts)).hexdigest()
    return f'"{digest}-{len(parts)}"'


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the S3 clients expect
    upstream: tuple[str, int] = ("127.0.0.1", 0)

    def log_message(self, format, *args):  # quiet: the gateway keeps its own log
        pass

    def _connection(self) -> http.client.HTTPConnection:
        if getattr(self, "_upstream", None) is None:
            self._upstream = http.client.HTTPConnection(*self.upstream, timeout=600)
        return self._upstream

    def _forward(self) -> None:
        completing = self.command == "POST" and "uploadId=" in self.path
        body = bytearray() if completing else None
        conn = self._connection()
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                conn.putheader(name, value)
            conn.endheaders()
            self._copy_request_body(conn, body)
            response = conn.getresponse()
        except (ConnectionError, http.client.HTTPException, OSError):
            conn.close()
            self._upstream = None
            raise
        etag = multipart_etag(bytes(body)) if completing and body is not None else None
        self._send_response(response, etag)

    def _copy_request_body(self, conn, keep: bytearray | None) -> None:
        length = self.headers.get("Content-Length")
        if length is not None:
            left = int(length)
            while left:
                block = self.rfile.read(min(BLOCK, left))
                if not block:
                    raise ConnectionError("client closed the request body early")
                left -= len(block)
                conn.send(block)
                if keep is not None:
                    keep += block
        elif "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:  # forward the chunk framing as it is
                size_line = self.rfile.readline()
                conn.send(size_line)
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers, then the empty line
                        line = self.rfile.readline()
                        conn.send(line)
                        if line in (b"\r\n", b"\n", b""):
                            return
                data = self.rfile.read(size + 2)
                conn.send(data)
                if keep is not None:
                    keep += data[:size]

    def _send_response(self, response: http.client.HTTPResponse, etag: str | None) -> None:
        headers = response.getheaders()
        if etag is not None:
            payload = response.read()
            if _EMPTY_ETAG.search(payload):
                payload = _EMPTY_ETAG.sub(f"<ETag>{etag}</ETag>".encode(), payload, count=1)
            headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "transfer-encoding")]
            headers.append(("Content-Length", str(len(payload))))
            self._head(response, headers)
            self.wfile.write(payload)
            return
        self._head(response, headers)
        if self.command == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200:
            response.read()
            return
        chunked = any(k.lower() == "transfer-encoding" and "chunked" in v.lower() for k, v in headers)
        while True:
            block = response.read1(BLOCK) if chunked else response.read(BLOCK)
            if not block:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        if response.will_close:
            self.close_connection = True

    def _head(self, response, headers) -> None:
        self.send_response_only(response.status, response.reason)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(listen: tuple[str, int], upstream: tuple[str, int]) -> Server:
    handler = type("BoundProxy", (Proxy,), {"upstream": upstream})
    return Server(listen, handler)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, type=_address)
    p.add_argument("--upstream", required=True, type=_address)
    args = p.parse_args(argv)
    server = serve(args.listen, args.upstream)
    print(f"listening on {server.server_address[0]}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
