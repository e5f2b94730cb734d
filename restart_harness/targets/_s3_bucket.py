"""Where a bucket is and how it is reached, configured the way AWS tools are (docs/s3.md's table: region, endpoint,
credentials, addressing, retries), and the checks, listing and deletion made with that client, its errors said in one
line, and its request log counted (targets/s3.py stores checkpoints there)."""

from __future__ import annotations

import configparser
import os
import re
import socket
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SCHEME = "s3://"
DEFAULT_REGION = "us-east-1"


def client_errors() -> tuple[type[BaseException], ...]:
    """The S3 client's exception types (none when the s3 extra is not installed: nothing can raise them)."""
    try:
        from s3torchconnectorclient import S3Exception
    except ImportError:
        return ()
    return (S3Exception,)


def is_s3(text) -> bool:
    return isinstance(text, str) and text.startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # no leading or trailing slash; may be ""

    @classmethod
    def parse(cls, text: str) -> S3Url:
        """s3://bucket[/prefix]; ValueError naming what is wrong."""
        if not is_s3(text):
            raise ValueError(f"{text} is not an s3:// URL")
        bucket, _, prefix = text[len(SCHEME):].partition("/")
        if not bucket or not all(c.isalnum() or c in ".-" for c in bucket) or not 3 <= len(bucket) <= 63:
            raise ValueError(f"{text}: {bucket!r} is not a bucket name (3-63 of a-z 0-9 . -)")
        return cls(bucket, prefix.strip("/"))

    def child(self, *parts: str) -> S3Url:
        return S3Url(self.bucket, "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/")))

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"


@dataclass(frozen=True)
class S3Settings:
    region: str
    endpoint_url: str | None
    profile: str | None
    max_attempts: int = 10  # tries per request, the first one included (the client's own default)

    @property
    def path_style(self) -> bool:
        return self.endpoint_url is not None

    @classmethod
    def from_environment(cls, env=None) -> S3Settings:
        env = os.environ if env is None else env
        profile = env.get("AWS_PROFILE") or None
        config = _profile_config(env, profile or "default")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or config.get("region") or DEFAULT_REGION
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or config.get("endpoint_url")
        attempts = env.get("AWS_MAX_ATTEMPTS") or config.get("max_attempts") or "10"
        if not attempts.strip().isdigit() or int(attempts) < 1:
            source = "AWS_MAX_ATTEMPTS" if env.get("AWS_MAX_ATTEMPTS") else "max_attempts in the AWS config"
            raise ValueError(f"{source}={attempts}: accepted a whole number of tries per request, >= 1")
        return cls(region, endpoint or None, profile, int(attempts))

    def describe(self) -> str:
        return f"region {self.region}, endpoint {self.endpoint_url or 'AWS'}" + (
            f", profile {self.profile}" if self.profile else "")

    def client_config(self):
        from s3torchconnector import S3ClientConfig

        return S3ClientConfig(force_path_style=self.path_style, profile=self.profile, max_attempts=self.max_attempts)

    def client(self, max_attempts: int | None = None):
        """s3torchconnector's own client (the one its checkpoint streams and DCP writer use)."""
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        return MountpointS3Client(self.region, endpoint=self.endpoint_url, force_path_style=self.path_style,
                                  profile=self.profile, max_attempts=max_attempts or self.max_attempts)

    def export(self) -> None:
        """Make the endpoint visible to clients built without an endpoint argument (s3torchconnector's DCP writer
        and reader read AWS_ENDPOINT_URL)."""
        if self.endpoint_url:
            os.environ["AWS_ENDPOINT_URL"] = self.endpoint_url
        os.environ.setdefault("AWS_REGION", self.region)


def _profile_config(env, profile: str) -> dict:
    path = Path(env.get("AWS_CONFIG_FILE") or Path.home() / ".aws" / "config").expanduser()
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error:
        return {}
    section = "default" if profile == "default" else f"profile {profile}"
    return dict(parser[section]) if parser.has_section(section) else {}


def check_reachable(settings: S3Settings, timeout: float = 3.0) -> str | None:
    """None when the endpoint accepts a TCP connection, else why not (the S3 client itself retries for minutes)."""
    if not settings.endpoint_url:
        return None  # AWS: name resolution and routing are the client's business
    parsed = urllib.parse.urlsplit(settings.endpoint_url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"endpoint {settings.endpoint_url} is not an http(s) URL"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"endpoint {settings.endpoint_url} is unreachable ({exc.strerror or exc})"


def check_writable(url: S3Url, settings: S3Settings) -> str | None:
    """None when the bucket exists and these credentials can list `url`'s prefix and write under it; else one line."""
    if problem := check_reachable(settings):
        return problem
    client = settings.client(max_attempts=2)
    probe = url.child(".restart-harness-probe")
    try:
        next(iter(client.list_objects(url.bucket, url.prefix + "/" if url.prefix else "", "/", 1)), None)
        client.put_object(url.bucket, probe.prefix).close()
        client.delete_object(url.bucket, probe.prefix)
    except client_errors() as exc:
        return f"{_explain(str(exc))} ({settings.describe()})"
    return None


def _explain(message: str) -> str:
    lower = message.lower()
    if "bucket does not exist" in lower or "nosuchbucket" in lower:
        return "the bucket does not exist"
    if "usersuspended" in lower:
        return f"access refused: the credentials' user is suspended ({message.strip()})"
    if "slow_down" in lower or "throttl" in lower:
        return f"requests throttled (503 SlowDown) beyond the client's retries ({message.strip()})"
    if any(s in lower for s in ("socket_closed", "connection_refused", "socket is closed", "connection refused",
                                "socket_timeout", "timed out")):
        return f"the endpoint stopped answering, after the client's retries ({message.strip()})"
    if "signaturedoesnotmatch" in lower or "invalidaccesskeyid" in lower or "no credentials" in lower \
            or "credentials" in lower:
        return f"access refused: wrong or missing credentials ({message.strip()})"
    if "forbidden" in lower or "accessdenied" in lower:  # a suspended user's requests get this too (Ceph RGW)
        return f"access refused: these credentials are not (or no longer) allowed here ({message.strip()})"
    return message.strip()


def listing(url: S3Url, settings: S3Settings, client=None) -> list[tuple[str, int]]:
    """(key relative to url, bytes) of every object under url, sorted by key."""
    client = client or settings.client()
    prefix = url.prefix + "/" if url.prefix else ""
    return sorted((o.key[len(prefix):], o.size) for page in client.list_objects(url.bucket, prefix)
                  for o in page.object_info)


def delete_all(url: S3Url, settings: S3Settings) -> int:
    """Delete every object under url; returns how many."""
    client = settings.client()
    objects = listing(url, settings, client)
    for key, _ in objects:
        client.delete_object(url.bucket, url.child(key).prefix)
    return len(objects)


# s3torchconnectorclient 1.5 writes its Rust client's (mountpoint-s3-client) log when S3_TORCH_CONNECTOR_DEBUG_LOGS names
# a filter, into hourly files under S3_TORCH_CONNECTOR_LOGS_DIR_PATH (both read when the module is first imported). At
# debug level each HTTP request is one line (`S3 request finished|failed|canceled request_type=... crt_error=...
# http_status=...`) inside its operation's span (`put_object{id=N ...}`); an operation whose error reaches the caller is
# one `meta request failed` line.
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
