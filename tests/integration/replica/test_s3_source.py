"""The built-in TorchScript handler reading models from a real S3-compatible server on loopback."""

import io
import warnings

import aiohttp
import boto3
import pytest
import torch
from moto.server import ThreadedMotoServer

from modelplex.wire.names import MODEL_ID_HEADER

from support.servers import free_port, wait_ready

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "modelplex", "AWS_SECRET_ACCESS_KEY": "modelplex-secret", "AWS_REGION": "us-east-1"}


@pytest.fixture
def s3_endpoint():
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def scripted_linear(seed: int) -> bytes:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(model.eval()), buffer)
    return buffer.getvalue()


def expected(seed: int, row: list[float]) -> list[float]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        return model(torch.tensor([row])).tolist()[0]


async def test_models_load_from_s3_and_missing_keys_are_404(processes, tmp_path, s3_endpoint):
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, **{
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"], "region_name": "us-east-1"})
    s3.create_bucket(Bucket="models")
    for seed in (1, 2):
        s3.put_object(Bucket="models", Key=f"tenant-{seed}/model.pt", Body=scripted_linear(seed))
    manifest = tmp_path / "s3.yaml"
    manifest.write_text(
        "apiVersion: modelplex.io/v1alpha1\nkind: MultiplexedDeployment\nmetadata: {name: s3}\n"
        "spec:\n  image: local\n  modelSource: {uri: 's3://models/{model_id}/model.pt'}\n"
        "  batching: {batchWaitTimeoutMs: 1}\n"
    )
    replica = processes.replica(manifest, env={**CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint})
    row = [0.5, -1.0, 2.0]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await wait_ready(session, replica)
        for seed in (1, 2):
            headers = {MODEL_ID_HEADER: f"tenant-{seed}"}
            async with session.post(replica.url + "/v1/invoke", json={"inputs": row}, headers=headers) as response:
                assert response.status == 200, await response.text()
                outputs = (await response.json())["outputs"]
            assert outputs == pytest.approx(expected(seed, row), abs=1e-5)
        async with session.post(replica.url + "/v1/invoke", json={"inputs": row},
                                headers={MODEL_ID_HEADER: "tenant-9"}) as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "model_not_found"
        async with session.get(replica.url + "/v1/models") as response:
            assert sorted((await response.json())["models"]) == ["tenant-1", "tenant-2"]
