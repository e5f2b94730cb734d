"""What the S3 client saw: s3torchconnector's request log, counted (targets/s3.py's requests()).

s3torchconnectorclient 1.5 writes the log of its Rust client (mountpoint-s3-client) when S3_TORCH_CONNECTOR_DEBUG_LOGS
names a filter, into hourly files under S3_TORCH_CONNECTOR_LOGS_DIR_PATH; both are read when the module is first
imported. At debug level every HTTP request the client sends is one line (`S3 request finished|failed|canceled
request_type=... crt_error=... http_status=...`) inside the span of its operation (`put_object{id=N ...}`), and an
operation whose error reaches the caller is one `meta request failed` line."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

CLIENT_LOG_FILTER = "mountpoint_s3_client=debug,warn"
_REQUEST = re.compile(r'(\w+)\{id=(\d+)[^}]*\}: \S+ S3 request (finished|failed|canceled) request_type=(\w+) '
                      r'crt_error=(None|Some\(Error\((\d+), "([^"]*)"\)\))(?: http_status=(\d+))?')
_OPERATION_FAILED = re.compile(r'(\w+)\{id=(\d+)[^}]*\}: .*meta request failed')


def client_requests(log_dir: Path) -> dict | None:
    """The requests s3torchconnector's client logged under log_dir (one folder per rank), or None: no log."""
    files = sorted(Path(log_dir).glob("*/s3torchconnectorclient.log*")) if Path(log_dir).is_dir() else []
    if not files:
        return None
    by_type, failures, failed_in = Counter(), Counter(), Counter()  # failed_in: operation -> its failed requests
    failed_ops: set[tuple] = set()
    counts = {"requests": 0, "failed_requests": 0, "throttled_requests": 0, "canceled_requests": 0}
    for path in files:
        with open(path, errors="replace") as f:
            for line in f:
                if m := _REQUEST.search(line):
                    span, ident, outcome, kind, _, _, crt_message, status = m.groups()
                    counts["requests"] += 1
                    by_type[kind] += 1
                    if outcome == "canceled":
                        counts["canceled_requests"] += 1
                    elif outcome == "failed":
                        counts["failed_requests"] += 1
                        # HTTP 503 SlowDown, or the CRT's symbol (AWS_IO_SOCKET_CLOSED) where no status came back
                        reason = (f"HTTP {status}" + (" SlowDown" if "SLOW_DOWN" in (crt_message or "") else "")
                                  if status else (crt_message or "unknown").split(",")[0].split(": ")[-1])
                        failures[reason] += 1
                        if status in ("503", "429") or "SLOW_DOWN" in (crt_message or ""):
                            counts["throttled_requests"] += 1
                        op = (path.parent.name, span, ident)
                        failed_in[op] += 1
                elif m := _OPERATION_FAILED.search(line):
                    failed_ops.add((path.parent.name, *m.groups()))
    return {**counts,
            "retried_requests": sum(n for op, n in failed_in.items() if op not in failed_ops),
            "failed_operations": len(failed_ops),
            "by_type": dict(sorted(by_type.items())), "failures": dict(sorted(failures.items())),
            "ranks": len({p.parent.name for p in files}),
            "source": "s3torchconnector client log (mountpoint-s3-client, debug)"}
