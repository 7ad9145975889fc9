"""Secrets beside deployments in one manifest, as local mode reads them."""

from __future__ import annotations

import base64

import pytest
import yaml

from modelplex.wire.spec import SpecError, load_manifest_documents, load_manifests

DEPLOYMENT = {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "recs"},
              "spec": {"image": "local", "handler": "h:H",
                       "router": {"auth": {"secretRef": {"name": "recs-clients"}}}}}


def write(tmp_path, *documents):
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return path


def secret(**fields):
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "recs-clients"}, **fields}


def test_a_secret_s_data_is_decoded_and_string_data_wins(tmp_path):
    encoded = {"alice": base64.b64encode(b"from-data").decode(), "bob": base64.b64encode(b"b").decode()}
    path = write(tmp_path, DEPLOYMENT, secret(data=encoded, stringData={"alice": "from-string-data"}))
    deployments, (found,) = load_manifest_documents(path)
    assert [d.name for d in deployments] == ["recs"] and found.namespace == "default"
    assert found.data == {"alice": "from-string-data", "bob": "b"}
    assert [d.name for d in load_manifests(path)] == ["recs"]  # the replicas' and routers' reading


def test_a_secret_whose_data_is_not_base64_names_the_key(tmp_path):
    with pytest.raises(SpecError, match="data.alice"):
        load_manifest_documents(write(tmp_path, DEPLOYMENT, secret(data={"alice": "not base64!"})))


def test_another_kind_is_refused_by_name(tmp_path):
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    with pytest.raises(SpecError, match="ConfigMap"):
        load_manifest_documents(write(tmp_path, DEPLOYMENT, other))
