"""Object storage as a checkpoint target: `ckpt_dir=s3://bucket/prefix`, read and written with s3torchconnector (the
`s3` extra), configured the way AWS tools are:

  region       AWS_REGION, else AWS_DEFAULT_REGION, else the profile's `region` in ~/.aws/config (AWS_CONFIG_FILE),
               else us-east-1
  endpoint     AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile's `endpoint_url`, else AWS's own
  credentials  the AWS credential chain of s3torchconnector's client: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
               (/ AWS_SESSION_TOKEN), else the profile (AWS_PROFILE) in ~/.aws/credentials, else instance roles
  addressing   path style (http://host/bucket/key) when an endpoint is given (S3-compatible servers), else virtual
               hosted, as AWS wants

A run's objects are `<prefix>/<run name>/<tag>/<DeepSpeed's or DCP's file name>`, and `<prefix>/<run name>/latest`
once a checkpoint is committed. The run directory keeps a local index of the same names (`checkpoint/`): DeepSpeed
finds its files by globbing a file system, so each object has an empty placeholder there, beside DeepSpeed's
recovery script and `latest`. Sizes, file counts and the inventory come from the bucket listing, never from the
placeholders.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

SCHEME = "s3://"


def client_errors() -> tuple[type[BaseException], ...]:
    """The S3 client's exception types (none when the s3 extra is not installed: nothing can raise them)."""
    try:
        from s3torchconnectorclient import S3Exception
    except ImportError:
        return ()
    return (S3Exception,)
DEFAULT_REGION = "us-east-1"


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
        return cls(region, endpoint or None, profile)

    def describe(self) -> str:
        return f"region {self.region}, endpoint {self.endpoint_url or 'AWS'}" + (
            f", profile {self.profile}" if self.profile else "")

    def client_config(self):
        from s3torchconnector import S3ClientConfig

        return S3ClientConfig(force_path_style=self.path_style, profile=self.profile)

    def client(self, max_attempts: int = 10):
        """s3torchconnector's own client (the one its checkpoint streams and DCP writer use)."""
        from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

        return MountpointS3Client(self.region, endpoint=self.endpoint_url, force_path_style=self.path_style,
                                  profile=self.profile, max_attempts=max_attempts)

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
    if "signaturedoesnotmatch" in lower or "invalidaccesskeyid" in lower or "forbidden" in lower \
            or "accessdenied" in lower or "no credentials" in lower or "credentials" in lower:
        return f"access refused: wrong or missing credentials ({message.strip()})"
    return message.strip()


def listing(url: S3Url, settings: S3Settings, client=None) -> list[tuple[str, int]]:
    """(key relative to url, bytes) of every object under url, sorted by key."""
    client = client or settings.client()
    prefix = url.prefix + "/" if url.prefix else ""
    out = []
    for page in client.list_objects(url.bucket, prefix):
        out += [(o.key[len(prefix):], o.size) for o in page.object_info]
    return sorted(out)


def delete_all(url: S3Url, settings: S3Settings) -> int:
    """Delete every object under url; returns how many."""
    client = settings.client()
    objects = listing(url, settings, client)
    for key, _ in objects:
        client.delete_object(url.bucket, url.child(key).prefix)
    return len(objects)


class TimedStream:
    """An object stream whose blocking calls run inside region(category): the save and load anatomy's `write` and
    `read` for object storage, where the I/O counters see no files (the bytes go over the network). write() hands
    data to the client's uploader and blocks while its buffers are full; close() completes the multipart upload;
    read()/readinto()/seek() wait for the GET's bytes."""

    def __init__(self, stream, region, category: str):
        self._stream, self._region, self._category = stream, region, category

    def _timed(self, name: str, *args):
        with self._region(self._category):
            return getattr(self._stream, name)(*args)

    def write(self, data):
        return self._timed("write", data)

    def read(self, *args):
        return self._timed("read", *args)

    def readinto(self, buffer):
        return self._timed("readinto", buffer)

    def seek(self, *args):  # the reader fetches up to a forward target (and may ask the object's size)
        return self._timed("seek", *args)

    def flush(self):
        return self._timed("flush")

    def close(self):
        return self._timed("close")

    def __enter__(self):
        self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        with self._region(self._category):
            return self._stream.__exit__(*exc)

    def __getattr__(self, name):  # seek, tell, readable, ...
        return getattr(self._stream, name)


def _no_region(category: str):
    return contextlib.nullcontext()


class ObjectStore:
    """A run's checkpoint objects: every local path under `local_root` (what DeepSpeed and DCP are handed) names
    the object at the same relative key under `url`. `region` is the rank's anatomy region (set by the worker)."""

    def __init__(self, local_root: Path, url: S3Url, settings: S3Settings):
        self.local_root, self.url, self.settings = Path(local_root), url, settings
        self._client = None
        self.region = _no_region

    def timed(self, stream, category: str) -> TimedStream:
        return TimedStream(stream, lambda c: self.region(c), category)

    def timed_file_system(self, fs):
        """s3torchconnector's DCP S3FileSystem with its streams timed (write for "wb", read for "rb")."""
        opened = fs.create_stream

        @contextlib.contextmanager
        def create_stream(path, mode):
            with opened(path, mode) as stream:
                yield self.timed(stream, "write" if "w" in mode else "read")

        fs.create_stream = create_stream
        return fs

    @property
    def client(self):
        if self._client is None:
            self._client = self.settings.client()
        return self._client

    def url_of(self, local_path) -> S3Url:
        return self.url.child(str(Path(local_path).relative_to(self.local_root)))

    def placeholder(self, local_path) -> None:
        """The empty local file that lets DeepSpeed's globbing loader find the object of the same name."""
        path = Path(local_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def size(self, local_path) -> int:
        url = self.url_of(local_path)
        return self.client.head_object(url.bucket, url.prefix).size

    def objects(self, local_path) -> list[tuple[str, int]]:
        """(local path, bytes) of the object `local_path` names or, for a directory-like name (DCP), of every
        object under it."""
        url = self.url_of(local_path)
        under = listing(url, self.settings, self.client)
        if under:
            return [(str(Path(local_path) / key), size) for key, size in under]
        return [(str(local_path), self.size(local_path))]

    def put_text(self, local_path, text: str) -> None:
        url = self.url_of(local_path)
        stream = self.client.put_object(url.bucket, url.prefix)
        stream.write(text.encode())
        stream.close()
