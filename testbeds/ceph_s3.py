"""A throwaway single-node Ceph cluster serving S3 on 127.0.0.1: one monitor, one OSD on memstore (objects live in
the OSD's memory; no block device), one RADOS Gateway, and the ETag proxy of third_party/rgw_multipart_etag.py in
front of it (Ceph 16.2.15's gateway returns an empty multipart ETag that s3torchconnector 1.5 cannot take). Debian 12
packages: radosgw ceph-mon ceph-osd ceph-common (scripts/apt/s3.txt). No systemd, no root needed, everything (config,
data, logs, pid files) in one folder; about 12-30 s from nothing to serving.

    python -m testbeds.ceph_s3 start DIR [--bucket NAME] [--memory-mib N]   prints `export ...` lines
    python -m testbeds.ceph_s3 stop DIR

(scripts/local-s3.sh wraps both.) The tests start one per session (tests/conftest.py) and stop it at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from testbeds import free_port, terminate

PACKAGES = ("radosgw", "ceph-mon", "ceph-osd", "ceph-common")
ACCESS_KEY = "restartharness"
SECRET_KEY = "restartharness-local-secret"
REGION = "us-east-1"
USER = "restart-harness"  # the S3 user the keys above belong to
DAEMONS = ("proxy", "client.rgw.a", "osd.0", "mon.a")  # stop order


class LocalS3Error(RuntimeError):
    pass


@dataclass(frozen=True)
class LocalS3:
    root: str
    endpoint_url: str  # the proxy: what clients use
    gateway_url: str  # radosgw itself (tests of the gateway's own behaviour)
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION

    def environment(self) -> dict[str, str]:
        """The AWS-style variables a client (the harness, aws, boto3, s3torchconnector) needs for this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                     aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key).create_bucket(Bucket=name)


def _config(root: Path, fsid: str, mon_port: int, gateway_port: int, memory_mib: int) -> str:
    return f"""[global]
fsid = {fsid}
mon_host = v2:127.0.0.1:{mon_port}
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
osd_crush_chooseleaf_type = 0
mon_data_avail_warn = 1
mon_data_avail_crit = 0
run_dir = {root}/run
log_file = {root}/log/$name.log
pid_file = {root}/run/$name.pid
admin_socket = {root}/run/$name.asok
mon_data = {root}/mon/$cluster-$id
osd_data = {root}/osd/$cluster-$id
osd_objectstore = memstore
memstore_device_bytes = {memory_mib << 20}
ms_bind_ipv6 = false

[client.rgw.a]
rgw_frontends = beast endpoint=127.0.0.1:{gateway_port}
auth_client_required = none
ms_mon_client_mode = crc
rgw_gc_obj_min_wait = 0
rgw_gc_processor_period = 5
rgw_data = {root}/rgw

[client.admin]
# radosgw-admin and ceph run as client.admin: one socket per process, so two at once (a suspend still ending while
# an enable starts) do not refuse each other with "bind ... client.admin.asok: File exists"
admin_socket = {root}/run/$name.$pid.asok
"""


def _run(root: Path, *command: str, timeout: float = 60) -> str:
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout, check=False,
                            env={**os.environ, "CEPH_CONF": str(root / "ceph.conf")})
    if result.returncode != 0:
        raise LocalS3Error(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()[-400:]}")
    return result.stdout


def _wait_http(url: str, deadline: float, what: str, root: Path) -> None:
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            time.sleep(0.3)
    raise LocalS3Error(f"{what} at {url} did not answer; logs in {root}/log")


def start(root: Path, memory_mib: int = 2048, timeout: float = 120) -> LocalS3:
    """Start the cluster, the gateway and the proxy in `root` (created; must not hold a running server)."""
    tools = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
    if missing := [t for t in tools if shutil.which(t) is None]:
        raise LocalS3Error(f"missing {', '.join(missing)}: apt-get install {' '.join(PACKAGES)}")
    root = Path(root).resolve()
    if (root / "server.json").exists():
        raise LocalS3Error(f"{root} already holds a server (stop it first: ceph_s3 stop {root})")
    for sub in ("run", "log", "mon/ceph-a", "osd/ceph-0", "rgw"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    deadline = time.time() + timeout
    fsid, osd_uuid = str(uuid.uuid4()), str(uuid.uuid4())
    mon_port, gateway_port, proxy_port = free_port(), free_port(), free_port()
    (root / "ceph.conf").write_text(_config(root, fsid, mon_port, gateway_port, memory_mib))
    try:
        _run(root, "monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", "--fsid", fsid,
             str(root / "monmap"))
        _run(root, "ceph-mon", "--mkfs", "-i", "a", "--monmap", str(root / "monmap"))
        _run(root, "ceph-mon", "-i", "a")
        osd = _run(root, "ceph", "osd", "new", osd_uuid).strip()
        _run(root, "ceph-osd", "-i", osd, "--mkfs", "--osd-uuid", osd_uuid)
        _run(root, "ceph-osd", "-i", osd)
        _run(root, "radosgw", "-n", "client.rgw.a")
        gateway = f"http://127.0.0.1:{gateway_port}"
        _wait_http(gateway, deadline, "radosgw", root)
        _run(root, "radosgw-admin", "user", "create", f"--uid={USER}", f"--display-name={USER}",
             f"--access-key={ACCESS_KEY}", f"--secret-key={SECRET_KEY}")
        with open(root / "log" / "proxy.log", "wb") as log:
            proxy = subprocess.Popen([sys.executable, "-m", "third_party.rgw_multipart_etag", "--listen",
                                      f"127.0.0.1:{proxy_port}", "--upstream", f"127.0.0.1:{gateway_port}"],
                                     stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                                     cwd=Path(__file__).resolve().parents[2])
        (root / "run" / "proxy.pid").write_text(str(proxy.pid))
        endpoint = f"http://127.0.0.1:{proxy_port}"
        _wait_http(endpoint, deadline, "the ETag proxy", root)
    except BaseException:
        stop(root)
        raise
    server = LocalS3(str(root), endpoint, gateway)
    (root / "server.json").write_text(json.dumps(asdict(server), indent=1))
    return server


def kill_gateway(root: Path) -> None:
    """SIGKILL the RADOS Gateway of the server in `root`, as a crash would; the cluster (and its objects) stays."""
    terminate([int((Path(root).resolve() / "run" / "client.rgw.a.pid").read_text().strip())], 30, signal.SIGKILL)


def start_gateway(root: Path, timeout: float = 60) -> None:
    """Start the gateway of the server in `root` again, on its port, and wait until it answers."""
    root = Path(root).resolve()
    server = json.loads((root / "server.json").read_text())
    _run(root, "radosgw", "-n", "client.rgw.a")
    _wait_http(server["gateway_url"], time.time() + timeout, "radosgw", root)


def set_user_suspended(root: Path, suspended: bool) -> None:
    """Suspend the server's S3 user (every request with its keys is refused: 403 UserSuspended) or enable it again."""
    _run(Path(root).resolve(), "radosgw-admin", "user", "suspend" if suspended else "enable", f"--uid={USER}")


def stop(root: Path, timeout: float = 30) -> None:
    """Stop every daemon started in `root` and delete the folder (the data lived in memory anyway)."""
    root = Path(root).resolve()
    pids = []
    for name in DAEMONS:
        with contextlib.suppress(FileNotFoundError, ValueError):
            pids.append(int((root / "run" / f"{name}.pid").read_text().strip()))
    terminate(pids, timeout)
    shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="start a server in DIR; prints the environment to use it")
    s.add_argument("dir", type=Path)
    s.add_argument("--bucket", action="append", default=[], help="create this bucket (repeatable)")
    s.add_argument("--memory-mib", type=int, default=2048, help="object memory of the OSD (default 2048)")
    sub.add_parser("stop", help="stop the server in DIR and delete DIR").add_argument("dir", type=Path)
    args = p.parse_args(argv)
    try:
        if args.command == "stop":
            stop(args.dir)
            return 0
        server = start(args.dir, args.memory_mib)
        for bucket in args.bucket:
            server.create_bucket(bucket)
    except LocalS3Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, value in server.environment().items():
        print(f"export {name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
