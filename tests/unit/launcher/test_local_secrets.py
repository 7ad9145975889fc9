"""Local mode gives a router the client tokens of the Secret its spec names, from the manifests."""

from __future__ import annotations

import pytest
import yaml

from modelplex.processes import consecutive_free_ports
from modelplex.wire.spec import SpecError
from modelplex_launcher.local import plan

DEPLOYMENT = {"apiVersion": "modelplex.io/v1alpha1", "kind": "MultiplexedDeployment", "metadata": {"name": "recs"},
              "spec": {"image": "local", "handler": "h:H",
                       "router": {"auth": {"secretRef": {"name": "recs-clients"}}}}}
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "recs-clients"}, "stringData": {"alice": "a"}}


def write(tmp_path, *documents):
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def test_router_auth_without_its_secret_in_the_manifests_is_refused_by_local_mode(tmp_path):
    with pytest.raises(SpecError, match=r"spec.router.auth.secretRef: no Secret 'recs-clients'"):
        plan([write(tmp_path, DEPLOYMENT)], host="127.0.0.1", port=consecutive_free_ports(1))
    (only,) = plan([write(tmp_path, DEPLOYMENT, SECRET)], host="127.0.0.1", port=consecutive_free_ports(1))
    assert only.client_tokens == {"alice": "a"}
