"""MLflow artifacts on an S3-compatible object store, the storage every host shares: the prod registry
resource with `MLPLANE_MLFLOW_ARTIFACT_ROOT=s3://...` and `MLFLOW_S3_ENDPOINT_URL` writes model versions
into the bucket and reads them back from it. moto's S3 server (a real HTTP server speaking the S3 API)
stands for the cloud object store, which cannot be reached from here; MLflow talks to it through boto3
exactly as it would to AWS S3, MinIO or Ceph."""

from __future__ import annotations

import hashlib
import json

import boto3
import pytest
from moto.server import ThreadedMotoServer

from engines.models.registry import CorruptArtifactError
from resources.registry import ModelRegistryResource

BUCKET = "mlplane-models"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mlplane", "AWS_SECRET_ACCESS_KEY": "not-a-secret"}

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def object_store():
    """The endpoint of a fresh S3 server holding one empty bucket."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3(endpoint).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


def s3(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **lower(CREDENTIALS))


def lower(env: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in env.items()}


@pytest.fixture
def registry(object_store, monkeypatch, tmp_path):
    """The prod registry resource: tracking in a database, artifacts under s3://mlplane-models/mlflow."""
    for name, value in {**CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL": object_store}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    resource = ModelRegistryResource(
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", artifact_root=f"s3://{BUCKET}/mlflow"
    )
    return resource.get_client()


def model_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (folder / "config.json").write_text(json.dumps({"dim": 16}))
    return folder


def test_a_model_version_is_stored_in_the_bucket_and_read_back_from_it(registry, object_store, tmp_path):
    version = registry.register("ranker", model_folder(tmp_path), {"mlplane.code_version": "test"}, {"auc": 0.7})
    keys = {o["Key"]: o for o in s3(object_store).list_objects_v2(Bucket=BUCKET)["Contents"]}
    weights = [k for k in keys if k.startswith("mlflow/") and k.endswith("/model/weights.bin")]
    assert len(weights) == 1 and any(k.endswith("/model/CHECKSUMS.json") for k in keys)
    stored = s3(object_store).get_object(Bucket=BUCKET, Key=weights[0])["Body"].read()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(bytes(range(256)) * 64).digest()

    loaded = registry.load("ranker", version.version, tmp_path / "download")
    assert (loaded / "weights.bin").read_bytes() == stored
    assert json.loads((loaded / "config.json").read_text()) == {"dim": 16}
    assert list((tmp_path / "cwd").iterdir()) == []  # nothing staged in the working folder


def test_an_artifact_changed_in_the_bucket_is_refused_on_load(registry, object_store, tmp_path):
    version = registry.register("tampered", model_folder(tmp_path), {}, {})
    client = s3(object_store)
    [key] = [
        o["Key"]
        for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]
        if o["Key"].endswith("/model/weights.bin") and version.run_id in o["Key"]
    ]
    client.put_object(Bucket=BUCKET, Key=key, Body=b"not the registered weights")
    with pytest.raises(CorruptArtifactError, match="weights.bin"):
        registry.load("tampered", version.version, tmp_path / "download")
