"""Local mode gives the replicas the Secret ``spec.modelSource.secretRef`` names, as a pod's envFrom."""

from __future__ import annotations

import json

from modelplex.processes import consecutive_free_ports
from modelplex_launcher.local import plan

SOURCE = {"uri": "https://store.example/{model_id}.pt", "secretRef": {"name": "store-reader"}}


def test_the_source_secret_of_the_manifests_is_the_replicas_environment(tmp_path):
    deployment = {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment",
                  "metadata": {"name": "zoo"}, "spec": {"image": "local", "modelSource": SOURCE}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "store-reader"},
              "stringData": {"MODELPLEX_SOURCE_HEADER_AUTHORIZATION": "Bearer t0k"}}
    with_secret, without = tmp_path / "with.yaml", tmp_path / "without.yaml"
    with_secret.write_text("\n---\n".join(json.dumps(document) for document in (deployment, secret)))
    without.write_text(json.dumps(deployment))
    (found,) = plan([str(with_secret)], host="127.0.0.1", port=consecutive_free_ports(1))
    assert found.source_env == {"MODELPLEX_SOURCE_HEADER_AUTHORIZATION": "Bearer t0k"}
    (absent,) = plan([str(without)], host="127.0.0.1", port=consecutive_free_ports(1))
    assert absent.source_env == {}  # the replicas see local mode's own environment only
