"""ckpt_dir=s3://bucket/prefix: object storage as a checkpoint target, read and written with s3torchconnector (the
`s3` extra), configured the way AWS tools are (targets/_s3_bucket.py). Object names, the local index of placeholders,
durability and the baseline probe: docs/s3.md."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import socket
from pathlib import Path

from restart_harness.errors import UsageError
from restart_harness.files import baseline, pagecache
from restart_harness.files.atomic import write_text_atomic
from restart_harness.targets import _s3_bucket
from restart_harness.targets._s3_bucket import S3Settings, S3Url, _explain, client_errors, delete_all, listing
from restart_harness.targets.base import LATEST, NO_OBSERVER, OBJECT, PER_RANK_DIRS, StorageProbe, Store, Stored, Target


class TimedStream:
    """An object stream whose blocking calls run inside observer.region(category), and whose bytes it counts: the save
    and load anatomy's `write` and `read` for object storage, where the I/O counters see no files (the bytes go over
    the network). write() hands data to the client's uploader and blocks while its buffers are full; close()
    completes the multipart upload; read()/readinto()/seek() wait for the GET's bytes."""

    def __init__(self, stream, observer, category: str):
        self._stream, self._observer, self._category = stream, observer, category

    def _timed(self, name: str, *args, nbytes=None):
        """The stream's call inside the region; nbytes(its result): the bytes it moved, counted."""
        with self._observer.region(self._category):
            result = getattr(self._stream, name)(*args)
        if nbytes is not None:
            self._observer.add_bytes(self._category, nbytes(result))
        return result

    def write(self, data):
        return self._timed("write", data, nbytes=lambda written: written if isinstance(written, int) else len(data))

    def read(self, *args):
        return self._timed("read", *args, nbytes=len)

    def readinto(self, buffer):
        return self._timed("readinto", buffer, nbytes=lambda n: n or 0)

    def __enter__(self):
        self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        with self._observer.region(self._category):
            return self._stream.__exit__(*exc)

    def __getattr__(self, name):  # seek (the reader fetches up to a forward target), flush, close: timed; tell, ...
        if name in ("seek", "flush", "close"):
            return lambda *args: self._timed(name, *args)
        return getattr(self._stream, name)


class S3Probe(StorageProbe):
    """The storage baseline of a bucket: PUT and GET through s3torchconnector's streams."""

    def key(self) -> str:
        ident = f"{socket.gethostname()}|{self.target.settings.endpoint_url}|{self.target.settings.region}|{self.target.url.bucket}"
        return f"s3-{hashlib.sha1(ident.encode()).hexdigest()[:12]}"

    def measure(self, file_bytes: int, ranks: int, tool: str) -> dict:
        """`ranks` threads each PUT one object of file_bytes (a multipart upload, complete - durable - when the write
        returns), then GET it back whole; the objects are deleted afterwards."""
        streams = self.target._streams()
        scratch = self.target.url.child(baseline.scratch_name())
        keys = [str(scratch.child(f"rh.{i}")) for i in range(ranks)]
        payload = os.urandom(min(baseline.BLOCK_BYTES, file_bytes))

        def put(i: int) -> None:
            left = file_bytes
            with streams.writer(keys[i]) as stream:
                while left:
                    left -= stream.write(payload[:min(left, len(payload))])

        def get(i: int) -> None:
            got = 0
            with streams.reader(keys[i]) as stream:
                while block := stream.read(baseline.BLOCK_BYTES):
                    got += len(block)
            if got != file_bytes:
                raise OSError(f"read {got} bytes of {keys[i]}, wrote {file_bytes}")

        try:
            write = baseline.phase(file_bytes * ranks, baseline.threads(ranks, put))
            read = baseline.phase(file_bytes * ranks, baseline.threads(ranks, get))
        finally:
            delete_all(scratch, self.target.settings)
        where = self.target.settings.endpoint_url or f"AWS {self.target.settings.region}"
        return {"write": write, "read": read, "read_cache": {"observed": "not applicable", "error": None},
                "method": "s3torchconnector put/get", "tool": "s3", "dir": str(self.target.url),
                "filesystem": {"type": "s3", "device": where, "mount": f"s3://{self.target.url.bucket}",
                               "where": f"object store at {where}"},
                "block_bytes": len(payload), "write_means": "PUT until the upload completes",
                "read_means": "GET of each whole object"}


class S3Store(Store):
    def __init__(self, target: S3Target, observer=NO_OBSERVER):
        super().__init__(target, observer)
        self.url, self.settings = target.url, target.settings

    def _url_of(self, path) -> S3Url:
        return self.url.child(Path(path).relative_to(self.root).as_posix())

    @contextlib.contextmanager
    def destination(self, path, mode):
        streams = self.target._streams()
        url = str(self._url_of(path))
        stream = streams.writer(url) if "w" in mode else streams.reader(url)
        with TimedStream(stream, self.observer, "write" if "w" in mode else "read") as timed:
            yield timed

    def dcp_writer(self, path):
        return self._dcp("S3StorageWriter", path)

    def dcp_reader(self, path):
        return self._dcp("S3StorageReader", path)

    def _dcp(self, kind: str, path):
        """s3torchconnector's DCP storage writer or reader, its S3FileSystem's streams timed (write for "wb", read for
        "rb")."""
        from s3torchconnector import dcp

        storage = getattr(dcp, kind)(self.settings.region, str(self._url_of(path)),
                                     s3client_config=self.settings.client_config())
        opened, observer = storage.fs.create_stream, self.observer

        @contextlib.contextmanager
        def create_stream(path, mode):
            with opened(path, mode) as stream:
                yield TimedStream(stream, observer, "write" if "w" in mode else "read")

        storage.fs.create_stream = create_stream
        return storage

    def written(self, paths) -> None:
        """Empty placeholders under root, so that DeepSpeed's globbing loader finds the objects of those names."""
        for local in map(Path, paths):
            local.parent.mkdir(parents=True, exist_ok=True)
            local.touch()

    def make_durable(self, paths) -> None:
        pass  # an object exists only once its upload has completed

    def _objects(self, path) -> list[tuple[str, int]]:
        """(key, bytes) of the object `path` names or, for a folder-like name (DCP), of every object under it."""
        url, client = self._url_of(path), self.target._client
        under = listing(url, self.settings, client)
        if under:
            return under
        try:
            return [("", client.head_object(url.bucket, url.prefix).size)]
        except client_errors():
            return []

    def size(self, path) -> int:
        return sum(n for _, n in self._objects(path))

    def exists(self, path) -> bool:
        return bool(self._objects(path))

    def commit_latest(self, tag: str) -> None:
        url = self.url.child(LATEST)
        stream = self.target._client.put_object(url.bucket, url.prefix)
        stream.write(tag.encode())
        stream.close()
        write_text_atomic(self.root / LATEST, tag)  # the local index names it too

    def explain_save_failure(self, exc: BaseException, tag: str) -> BaseException:
        """The client's error after its retries, said as the storage's fault: what the endpoint did, while saving what."""
        if not isinstance(exc, client_errors()):
            return exc
        return RuntimeError(f"object storage at {self.settings.endpoint_url or 'AWS'} failed while saving {tag} to "
                            f"{self.url}: {_explain(str(exc))}")


class S3Stored(Stored):
    Store = S3Store

    def listing(self) -> dict[str, list[tuple[str, int]]]:
        out: dict[str, list[tuple[str, int]]] = {}
        for key, nbytes in listing(self.target.url, self.target.settings, self.target._client):
            tag, _, rel = key.partition("/")
            if rel:
                out.setdefault(tag, []).append((rel, nbytes))
        return out

    def delete(self) -> str:
        count = delete_all(self.target.url, self.target.settings)
        if self.root.is_dir():
            shutil.rmtree(self.root)
        return f"{count} objects under {self.target.url}"

    def prepare_cache(self, tag_dir: Path, requested: str, per_file: bool = False) -> dict:
        return pagecache.not_applicable(requested, "object storage: the restart reads over the network")

    def launch_environment(self, log_dir: Path) -> dict[str, str]:
        """The client's request log, one folder per rank (every request and its outcome: requests() counts them)."""
        return {"S3_TORCH_CONNECTOR_DEBUG_LOGS": _s3_bucket.CLIENT_LOG_FILTER,
                "S3_TORCH_CONNECTOR_LOGS_DIR_PATH": str(log_dir), PER_RANK_DIRS: "S3_TORCH_CONNECTOR_LOGS_DIR_PATH"}

    def requests(self, log_dir: Path) -> dict | None:
        return _s3_bucket.client_requests(log_dir)

    def abort_incomplete_uploads(self) -> dict:
        """Multipart uploads under the run's prefix that were started and never completed (a save that failed while
        its client could not abort them: the endpoint was gone) are aborted, so that their parts stop taking space.
        Through boto3 (the s3 extra): s3torchconnector's client cannot list uploads."""
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError:
            return {"aborted": [], "error": "boto3 is not installed (pip install 'restart-harness[s3]'): not checked"}
        s, url = self.target.settings, self.target.url
        config = botocore.config.Config(s3={"addressing_style": "path" if s.path_style else "auto"},
                                        retries={"max_attempts": 2}, connect_timeout=3, read_timeout=30)
        aborted: list[str] = []
        try:
            client = boto3.Session(profile_name=s.profile).client("s3", region_name=s.region,
                                                                  endpoint_url=s.endpoint_url, config=config)
            pages = client.get_paginator("list_multipart_uploads").paginate(Bucket=url.bucket, Prefix=url.prefix + "/")
            for upload in (u for page in pages for u in page.get("Uploads", [])):
                client.abort_multipart_upload(Bucket=url.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted.append(upload["Key"][len(url.prefix) + 1:])
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            return {"aborted": aborted, "error": f"{type(exc).__name__}: {exc}"}
        return {"aborted": aborted, "error": None}


class S3Target(Target):
    name = "s3"
    kind = OBJECT
    no_checksums = ("checkpoint files are read back for their checksums on a file system only (an object store "
                    "checks each upload's integrity itself)")
    description = "an S3 bucket (s3://bucket/prefix) through s3torchconnector: objects, uploads, listings"
    Stored = S3Stored

    def __init__(self, location: str | None, root: Path | None = None, results_dir=None,
                 url: S3Url | None = None, settings: S3Settings | None = None):
        super().__init__(location, root)
        self.url = url if url is not None else S3Url.parse(location)
        self.settings = settings or _settings(location or self.url)

    @classmethod
    def claims(cls, location) -> bool:
        if not _s3_bucket.is_s3(location):
            return False
        S3Url.parse(location)  # ValueError: targets.select names the key
        return True

    def preflight(self, key: str, need_bytes: int | None, reach: bool = True) -> None:
        """The client is installed, the endpoint answers, the bucket exists, the credentials list and write there (a
        probe object, deleted again). A bucket has no free-space figure: need_bytes is not checked."""
        if not reach:
            return
        where = f"{key}={self.location or self.url}"
        try:
            import s3torchconnector  # noqa: F401
        except ImportError:
            raise UsageError(f"{where}: object storage needs s3torchconnector, which this Python lacks: "
                             "pip install 'restart-harness[s3]'") from None
        if problem := _s3_bucket.check_writable(self.url, self.settings):
            raise UsageError(f"{where}: {problem}")

    def placed(self, run_dir: Path) -> S3Target:
        """The run's prefix: its run folder's name and a digest of that folder's host and path, so that two runs
        (whose folders were claimed exclusively) never share one (a bucket has no mkdir to claim a prefix with)."""
        owner = hashlib.sha1(f"{socket.gethostname()}:{run_dir.resolve()}".encode()).hexdigest()[:8]
        return S3Target(self.location, run_dir / "checkpoint", None, self.url.child(f"{run_dir.name}-{owner}"),
                        self.settings)

    def record(self, run_dir: Path) -> dict:
        s = self.settings
        return {**super().record(run_dir), "checkpoint_data_in_run": False, "checkpoint_url": str(self.url),
                "checkpoint_object_store": {"region": s.region, "endpoint_url": s.endpoint_url,
                                            "path_style": s.path_style, "client": "s3torchconnector",
                                            "max_attempts": s.max_attempts}}

    @classmethod
    def from_record(cls, record: dict, root: Path) -> S3Target:
        settings = _settings(record["checkpoint_url"])
        settings.export()  # s3torchconnector's DCP writer and reader find the endpoint in the environment
        return cls(None, root, None, S3Url.parse(record["checkpoint_url"]), settings)

    def describe(self) -> str:
        return str(self.url)

    def storage_probe(self) -> S3Probe:
        return S3Probe(self)

    @functools.cached_property
    def _client(self):
        """The S3 client of this place (one, made when first asked)."""
        return self.settings.client()

    def _streams(self):
        from s3torchconnector import S3Checkpoint

        return S3Checkpoint(self.settings.region, endpoint=self.settings.endpoint_url,
                            s3client_config=self.settings.client_config())


def _settings(where) -> S3Settings:
    """The AWS settings of this environment; UsageError naming ckpt_dir=`where` when they are malformed."""
    try:
        return S3Settings.from_environment()
    except ValueError as exc:
        raise UsageError(f"ckpt_dir={where}: {exc}") from None
