"""ckpt_dir=s3://... (docs/s3.md) against a real S3 server: a single-node Ceph RADOS Gateway started for this module
and stopped after it (testbeds/ceph_s3.py), with the ETag proxy of third_party/rgw_multipart_etag.py
in front. Real launches: DeepSpeed's torch.save engine through s3torchconnector's checkpoint streams, DCP on
DeepSpeed and on FSDP2 through its DCP writer and reader; every restart verified."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import copy_run, load_summary, restart, submit

pytestmark = pytest.mark.slow


@pytest.fixture
def server(s3_server):
    """The session's local S3 server (tests/conftest.py s3_server): its settings are in the environment."""
    return s3_server


def objects(server, prefix: str) -> dict[str, int]:
    from restart_harness.targets.s3 import S3Settings, S3Url, listing

    return dict(listing(S3Url.parse(f"s3://ckpt/{prefix}"), S3Settings.from_environment()))


def prefix_of(run_dir: Path) -> str:
    """The run's own prefix in the bucket (its name and its owner's digest: targets/s3.py placed())."""
    return json.loads((run_dir / "spec.json").read_text())["checkpoint_url"][len("s3://ckpt/"):]


@pytest.fixture
def default_s3(server, harness) -> Path:
    return harness.run("s3-default-dp2")


def test_torch_save_round_trips_through_the_object_store(server, default_s3):
    summary = load_summary(default_s3)
    assert summary["restart"]["verified"] and summary["restart"]["cache"]["observed"] == "not applicable"
    spec = json.loads((default_s3 / "spec.json").read_text())
    url = spec["checkpoint_url"]
    assert url.startswith(f"s3://ckpt/runs/{default_s3.name}-")  # the run's own prefix: its name and its owner
    stored = objects(server, url[len("s3://ckpt/"):])
    # every DeepSpeed file is an object of the run's prefix, `latest` too; sizes and counts are the listing's
    tag_files = {k.split("/", 1)[1]: n for k, n in stored.items() if k.startswith("global_step2/")}
    assert set(tag_files) == {"mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                              "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"}
    assert "latest" in stored
    inventory = json.loads((default_s3 / "inventory.json").read_text())
    assert inventory["dir"] == f"{url}/global_step2"
    assert {f["path"]: f["bytes"] for f in inventory["files"]} == tag_files
    assert summary["checkpoint"]["bytes"] == sum(tag_files.values()) > 1 << 20
    # the local index holds names only: an empty placeholder per object, never counted
    local = default_s3 / "checkpoint" / "global_step2"
    assert {p.name for p in local.iterdir()} == set(tag_files)
    assert all(p.stat().st_size == 0 for p in local.iterdir())
    # the baseline is the object store's, measured with the same client
    assert summary["baseline"]["method"] == "s3torchconnector put/get"


def test_fsdp2_dcp_round_trips_and_reshards_from_the_object_store(server, harness):
    run_dir = harness.run("s3-fsdp2-async-dp2")  # then restarted at dp=1: DCP reshards while it reads the objects
    assert load_summary(run_dir)["restarts"][0]["verified"]
    stored = objects(server, f"{prefix_of(run_dir)}/global_step2")
    assert set(stored) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    record = json.loads((run_dir / "records" / "restart-02.json").read_text())
    assert record["layout"]["loaded"] == "tp1-pp1-dp1"
    assert load_summary(run_dir)["restart"]["verified"]


def test_pipeline_layer_files_round_trip_through_the_object_store(server, harness):
    """pp=2: DeepSpeed's pipeline loader globs for layer files; it finds the placeholders and reads the objects."""
    run_dir = harness.run("s3-pp2")
    assert load_summary(run_dir)["restart"]["verified"]
    stored = objects(server, f"{prefix_of(run_dir)}/global_step2")
    assert sum(1 for k in stored if k.startswith("layer_")) >= 4
    inventory = json.loads((run_dir / "inventory.json").read_text())
    assert inventory["by_kind"]["layer_states"]["files"] == sum(1 for k in stored if k.startswith("layer_"))


def test_both_targets_and_both_stacks_side_by_side_in_one_report(server, default_s3, harness, tmp_path):
    """A file-system run of the same configuration is another configuration, never pooled with the S3 run."""
    fsdp2, local = harness.run("s3-fsdp2-dp2"), harness.run("dp2-short")
    proc = submit(["report", str(default_s3), str(fsdp2), str(local), "-o", str(tmp_path / "report")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "report" / "runs.csv", newline="") as f:
        labels = sorted(row["engine_label"] for row in csv.DictReader(f))
    assert labels == ["default", "default s3", "fsdp2 dcp s3"]
    from analysis.load import load
    from analysis.table import groups

    found = groups(load([default_s3, local])[0])
    assert sorted(g.engine for g in found) == ["default", "default s3"]


def test_dcp_on_deepspeed_round_trips_through_the_object_store(server, harness):
    run_dir = harness.run("s3-dcp-dp2")
    assert load_summary(run_dir)["restart"]["verified"]
    stored = objects(server, f"{prefix_of(run_dir)}/global_step2")
    assert "mp_rank_00_model_states.pt/.metadata" in stored and len(stored) == 6


@pytest.mark.parametrize("args, env, message", [
    (["ckpt_dir=s3://nosuchbucket/x"], {}, "the bucket does not exist"),
    (["ckpt_dir=s3://ckpt/x"], {"AWS_SECRET_ACCESS_KEY": "wrong"}, "wrong or missing credentials"),
    (["ckpt_dir=s3://ckpt/x"], {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "is unreachable"),
    (["ckpt_dir=s3://ckpt/x", "engine=lazy"], {}, "engine=lazy writes to a file system, not to object storage"),
    (["ckpt_dir=s3://ckpt/x", "emulate=true"], {}, "emulate=true writes to a file system"),
    (["ckpt_dir=s3://c/x"], {}, "is not a bucket name"),
    (["ckpt_dir=s3://ckpt/x"], {"AWS_MAX_ATTEMPTS": "many"}, "AWS_MAX_ATTEMPTS=many: accepted a whole number"),
    (["ckpt_dir=s3://ckpt/x"], {"AWS_MAX_ATTEMPTS": "0"}, "AWS_MAX_ATTEMPTS=0: accepted a whole number"),
])
def test_bad_object_store_input_is_one_line_before_anything_exists(server, tmp_path, args, env, message):
    proc = submit(["tiny", *args, f"results_dir={tmp_path / 'results'}"], tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("error: ckpt_dir="), proc.stderr
    assert not (tmp_path / "results").exists()
    assert not [k for k in objects(server, "x")]


def test_restart_at_another_layout_of_a_deepspeed_run_in_the_store_is_refused(server, default_s3):
    proc = restart(default_s3, "dp=1")
    assert proc.returncode == 2 and "universal-checkpoint converter reads a file system" in proc.stderr


def test_object_store_baseline_puts_and_gets_with_the_engines_client(server, tmp_path):
    proc = submit(["baseline", "dir=s3://ckpt/probe", "file_bytes=8M", "ranks=2"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "object store at " + server.endpoint_url in proc.stdout and "PUT until the upload completes" in proc.stdout
    assert objects(server, "probe") == {}  # its objects are deleted


def test_gateway_still_returns_an_empty_multipart_etag(server):
    """The reason for third_party/rgw_multipart_etag.py: straight to radosgw, s3torchconnector cannot write. When
    this fails, the gateway fills the ETag itself and the proxy can go."""
    from s3torchconnector import S3Checkpoint, S3ClientConfig, S3Exception

    direct = S3Checkpoint(server.region, endpoint=server.gateway_url, s3client_config=S3ClientConfig(force_path_style=True))
    with pytest.raises(S3Exception, match="ETag"), direct.writer("s3://ckpt/etag-probe") as stream:
        stream.write(b"x" * 1024)


def test_proxy_fills_in_the_etag_s3_defines_for_multipart_objects(server):
    """The ETag the proxy writes into CompleteMultipartUpload is the one the gateway itself reports afterwards."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=server.endpoint_url, region_name=server.region,
                      aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key)
    upload = s3.create_multipart_upload(Bucket="ckpt", Key="etag-check")["UploadId"]
    parts = [{"PartNumber": n, "ETag": s3.upload_part(Bucket="ckpt", Key="etag-check", UploadId=upload, PartNumber=n,
                                                      Body=bytes([n]) * (5 << 20))["ETag"]} for n in (1, 2)]
    done = s3.complete_multipart_upload(Bucket="ckpt", Key="etag-check", UploadId=upload,
                                        MultipartUpload={"Parts": parts})
    assert done["ETag"].endswith('-2"')
    assert done["ETag"] == s3.head_object(Bucket="ckpt", Key="etag-check")["ETag"]
    s3.delete_object(Bucket="ckpt", Key="etag-check")


def test_a_changed_object_fails_the_restart(server, default_s3, tmp_path):
    """Verification reads what the store returns: overwrite one optimizer object with another rank's (and put it
    back: the run is the table's)."""
    from restart_harness.targets.s3 import S3Settings

    client = S3Settings.from_environment().client()
    base = f"{prefix_of(default_s3)}/global_step2/bf16_zero_pp_rank_"
    victim = base + "0_mp_rank_00_optim_states.pt"
    client.copy_object("ckpt", victim, "ckpt", f"{victim}.kept")
    client.copy_object("ckpt", base + "1_mp_rank_00_optim_states.pt", "ckpt", victim)
    try:
        proc = restart(copy_run(default_s3, tmp_path))
    finally:
        client.copy_object("ckpt", f"{victim}.kept", "ckpt", victim)
        client.delete_object("ckpt", f"{victim}.kept")
    assert proc.returncode != 0
    assert "truncated or torn" in proc.stderr or "MISMATCH" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("message, said", [
    ("Client error: Forbidden: UserSuspended", "the credentials' user is suspended"),
    ("Client error: Forbidden: AccessDenied", "not (or no longer) allowed here"),  # also what a suspended user gets
    ("Client error: Forbidden: SignatureDoesNotMatch", "wrong or missing credentials"),
    ("Unknown CRT error: CRT error 1051: aws-c-io: AWS_IO_SOCKET_CLOSED, socket is closed.", "stopped answering"),
    ("aws-c-s3: AWS_ERROR_S3_SLOW_DOWN, Response code indicates throttling", "throttled"),
])
def test_client_errors_are_said_as_what_the_store_did(message, said):
    from restart_harness.targets.s3 import _explain

    assert said in _explain(message) and message in _explain(message)
