"""Object-storage faults against the real gateway (docs/faults.md): the session's Ceph RADOS Gateway
(tests/conftest.py s3_server) killed during a multipart upload, throttling (503 SlowDown) on a share of the
checkpoint's requests, the user's credentials suspended in the middle of a save, and the gateway restarted while a
restart reads. Faults are made real where the gateway can make them (a SIGKILLed radosgw, a suspended user) and
answered by a proxy in front of it where only a response can be (tests/s3_faults.py). In each case `latest` never
names an incomplete checkpoint, the status names the fault, the client's retries and throttled requests are counted
in the summary (from the client's own request log), incomplete multipart uploads are aborted or reported, and a
restart from the last committed checkpoint verifies."""

from __future__ import annotations

import csv
import json
import re
import threading
from pathlib import Path

import pytest
from conftest import CASE_LAUNCHER, load_summary, restart, submit
from s3_faults import SLOW_DOWN, FaultProxy

pytestmark = pytest.mark.slow

RUN = ["tiny", "dp=2", "iters=4", "save_interval=2", "after=1", "baseline=false", f"launcher={CASE_LAUNCHER}"]


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """A fault proxy in front of the session's server; every run and restart of the test goes through it."""
    with FaultProxy(s3_server.endpoint_url) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
        yield p
        p.wait_for_hooks()  # no fault is left being made when the next test starts


def the_run(results: Path) -> Path:
    (run_dir,) = [p for p in results.iterdir() if p.is_dir()]
    return run_dir


def stored_latest(run_dir: Path) -> str | None:
    from restart_harness.targets.s3 import S3Settings, S3Url

    url = S3Url.parse(json.loads((run_dir / "spec.json").read_text())["checkpoint_url"]).child("latest")
    client = S3Settings.from_environment().client(max_attempts=2)
    return b"".join(client.get_object(url.bucket, url.prefix)).decode()


def incomplete_uploads(server, prefix: str) -> list[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=server.endpoint_url, region_name=server.region,
                      aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key)
    return [u["Key"] for u in s3.list_multipart_uploads(Bucket="ckpt", Prefix=prefix).get("Uploads", [])]


def on_object(tag: str | None = None, method: str | None = None, part: bool = False):
    """Requests for the objects of one checkpoint tag (None: of any; the path, not a listing's query), of one method
    or for a part of an upload."""
    def when(r) -> bool:
        path = r.path.split("?")[0]
        return (re.search(f"/{tag or 'global_step[0-9]+'}/", path) is not None
                and (method is None or r.method == method)
                and (not part or "partNumber=" in r.path))
    return when


def phases(summary: dict) -> list[dict]:
    return [summary["checkpoint"], *summary["restarts"]]


def test_throttled_requests_are_retried_counted_and_the_run_verifies(s3_server, proxy, tmp_path):
    """Every third request for a checkpoint object is answered 503 SlowDown, as S3 answers a prefix over its
    request rate: the client retries, the run verifies, and the summary counts exactly the throttled requests."""
    rule = proxy.on(on_object(), respond=SLOW_DOWN, every=3)
    proc = submit([*RUN, "ckpt_dir=s3://ckpt/throttled", f"results_dir={tmp_path / 'results'}"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = load_summary(the_run(tmp_path / "results"))
    assert summary["restart"]["verified"] and summary["status"]["state"] == "complete"
    counted = [p["storage_requests"] for p in phases(summary)]
    assert rule.acted > 0 and sum(c["throttled_requests"] for c in counted) == rule.acted
    assert sum(c["retried_requests"] for c in counted) == rule.acted  # each absorbed by a retry
    assert all(c["failed_operations"] == 0 and c["ranks"] == 2 for c in counted)
    assert set(counted[0]["failures"]) == {"HTTP 503 SlowDown"}
    assert "throttled" in proc.stdout and "save requests" in proc.stdout
    report = submit(["report", str(the_run(tmp_path / "results")), "-o", str(tmp_path / "report")], tmp_path)
    assert report.returncode == 0, report.stderr
    with open(tmp_path / "report" / "runs.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["save_throttled_requests_count"]) == counted[0]["throttled_requests"]
    assert float(row["restart_retried_requests_count"]) == counted[1]["retried_requests"]


def test_gateway_killed_during_a_multipart_upload(s3_server, proxy, tmp_path, monkeypatch):
    """radosgw SIGKILLed as the first part of global_step4 is sent: the save fails after the client's retries (3
    tries per request here, AWS_MAX_ATTEMPTS; the default 10 take about 45 s), the status names the endpoint and
    the tag, `latest` stays global_step2, the uploads the dead gateway could not abort are reported, then aborted by
    the restart, which verifies global_step2."""
    from testbeds import ceph_s3

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    proxy.on(on_object("global_step4", part=True), before=lambda: ceph_s3.kill_gateway(s3_server.root), times=1)
    try:
        proc = submit([*RUN, "ckpt_dir=s3://ckpt/killed", f"results_dir={tmp_path / 'results'}"], tmp_path,
                      timeout=600)
    finally:
        proxy.wait_for_hooks()
        ceph_s3.start_gateway(s3_server.root)
    run_dir = the_run(tmp_path / "results")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed"
    assert "stopped answering" in status["reason"] and "while saving global_step4" in status["reason"], status
    assert stored_latest(run_dir) == "global_step2"
    summary = load_summary(run_dir)
    assert summary["spec"]["checkpoint_object_store"]["max_attempts"] == 3
    requests, uploads = summary["checkpoint"]["storage_requests"], summary["checkpoint"]["incomplete_uploads"]
    assert requests["failed_operations"] >= 1 and requests["failed_requests"] > requests["failed_operations"]
    assert uploads["error"] and not uploads["aborted"]  # the gateway was down: reported, not silently left
    prefix = f"killed/{run_dir.name}-"  # the run's own: its name and a digest of its folder (targets/s3.py placed())
    left = incomplete_uploads(s3_server, prefix)
    assert left and all("/global_step4/" in key for key in left), left

    proxy.clear()
    again = restart(run_dir)
    assert "incomplete multipart uploads" in again.stdout and not incomplete_uploads(s3_server, prefix), again.stdout
    summary = load_summary(run_dir)
    assert summary["restart"]["verified"] and summary["restart"]["tag"] == "global_step2"
    assert summary["restart"]["incomplete_uploads"]["aborted"]


def test_credentials_suspended_in_the_middle_of_a_save(s3_server, proxy, tmp_path):
    """The S3 user is suspended (radosgw-admin) as global_step4's first part is sent: the save fails at once (403
    is not retried), the status says access was refused, `latest` stays global_step2; with the user enabled again a
    restart aborts the upload left behind and verifies."""
    from testbeds import ceph_s3

    proxy.on(on_object("global_step4", part=True), before=lambda: ceph_s3.set_user_suspended(s3_server.root, True),
             times=1)
    try:
        proc = submit([*RUN, "ckpt_dir=s3://ckpt/revoked", f"results_dir={tmp_path / 'results'}"], tmp_path,
                      timeout=600)
    finally:
        proxy.wait_for_hooks()  # the suspend's radosgw-admin may still be ending when the other rank's 403 ends the run
        ceph_s3.set_user_suspended(s3_server.root, False)
    run_dir = the_run(tmp_path / "results")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reason = json.loads((run_dir / "status.json").read_text())["reason"]
    # the gateway answers a suspended user's requests UserSuspended or, for some, AccessDenied
    assert "access refused" in reason and "global_step4" in reason, reason
    assert "user is suspended" in reason or "no longer) allowed" in reason, reason
    assert stored_latest(run_dir) == "global_step2"
    summary = load_summary(run_dir)
    assert "HTTP 403" in summary["checkpoint"]["storage_requests"]["failures"]
    assert summary["checkpoint"]["incomplete_uploads"]["error"]  # still suspended when the phase ended

    proxy.clear()
    restart(run_dir)
    assert not incomplete_uploads(s3_server, f"revoked/{run_dir.name}/")
    assert load_summary(run_dir)["restart"]["verified"]


def test_gateway_restarted_while_a_restart_reads(s3_server, proxy, tmp_path):
    """A checkpoint phase, then a restart during whose first GET of a checkpoint object radosgw is SIGKILLed and
    started again: the client retries until the gateway is back, the restart verifies, and its summary counts the
    failed requests it retried."""
    from testbeds import ceph_s3

    proc = submit(["tiny", "dp=2", "iters=2", "phase=checkpoint", "baseline=false", "ckpt_dir=s3://ckpt/reread",
                   f"launcher={CASE_LAUNCHER}",
                   f"results_dir={tmp_path / 'results'}"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = the_run(tmp_path / "results")

    starting = threading.Thread(target=ceph_s3.start_gateway, args=(s3_server.root,), daemon=True)

    def bounce() -> None:
        ceph_s3.kill_gateway(s3_server.root)
        starting.start()  # back in a few seconds; this request gets no answer

    rule = proxy.on(on_object("global_step2", method="GET"), before=bounce, fail=True, times=1)
    try:
        again = restart(run_dir)
    finally:
        if starting.is_alive():
            starting.join()
    assert again.returncode == 0 and rule.acted == 1, again.stdout + again.stderr
    summary = load_summary(run_dir)
    requests = summary["restart"]["storage_requests"]
    assert summary["restart"]["verified"]
    assert requests["retried_requests"] >= 1 and requests["failed_operations"] == 0


def test_runs_started_together_into_one_bucket_prefix_share_nothing(s3_server, tmp_path):
    """Two runs started at the same moment into one results folder and one bucket prefix: each its own objects under
    its own run name, both verified, and `latest` of each names its own tag."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    from restart_harness.targets.s3 import S3Settings, S3Url, listing

    results = tmp_path / "results"
    args = [sys.executable, str(REPO / "config-n-run.py"), "tiny", "iters=2", "save_interval=2", "after=1",
            "baseline=false", f"results_dir={results}", "ckpt_dir=s3://ckpt/together", f"launcher={CASE_LAUNCHER}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = [Path(out.strip().splitlines()[-1]) for out, _ in outs]
    assert dirs[0] != dirs[1]
    stored = listing(S3Url.parse("s3://ckpt/together"), S3Settings.from_environment())
    for run_dir in dirs:
        summary = load_summary(run_dir)
        # the run's own prefix: its name and a digest of its folder's host and path (targets/s3.py placed())
        prefix = summary["checkpoint"]["dir"].removeprefix("s3://ckpt/together/").rpartition("/")[0]
        assert summary["restart"]["verified"] and prefix.startswith(f"{run_dir.name}-")
        own = {k for k, _ in stored if k.startswith(f"{prefix}/")}
        assert f"{prefix}/latest" in own and len(own) == summary["checkpoint"]["files"] + 1
    assert {k.split("/")[0].rpartition("-")[0] for k, _ in stored} == {d.name for d in dirs}
