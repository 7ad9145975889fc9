"""The node's generated configuration and images, checked without starting anything."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from pathlib import Path

from modelplex_cluster import node


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_an_oci_archive_names_its_image_and_every_blob_matches_its_digest():
    archive = node.oci_archive("modelplex.local/tool:1", {"bin/tool": (b"#!/bin/sh\n", 0o755), "bin/t": ("tool", 0)},
                               {"Entrypoint": ["/bin/tool"]})
    files = members(archive)
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "modelplex.local/tool:1"
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/bin/tool"]
    # the same inputs give the same image (a content-addressed cache can rely on it)
    assert node.oci_archive("modelplex.local/tool:1", {"bin/tool": (b"#!/bin/sh\n", 0o755), "bin/t": ("tool", 0)},
                            {"Entrypoint": ["/bin/tool"]}) == archive


def test_pods_get_no_default_route_and_the_plugin_leaves_forwarding_alone():
    config = node.cni_config(Path("/state/ipam"))
    bridge = config["plugins"][0]
    assert bridge["bridge"] == node.NODE_BRIDGE
    assert bridge["isGateway"] is False and "isDefaultGateway" not in bridge
    routes = [ipaddress.ip_network(r["dst"]) for r in bridge["ipam"]["routes"]]
    assert routes == [ipaddress.ip_network(node.SERVICE_CIDR)]
    (subnet,) = bridge["ipam"]["ranges"][0]
    assert ipaddress.ip_address(node.NODE_IP) in ipaddress.ip_network(subnet["subnet"])
    assert bridge["ipam"]["dataDir"] == "/state/ipam"  # not /var/lib/cni


def test_containerd_clamps_oom_scores_and_keeps_its_state_in_ours():
    text = node.containerd_config(Path("/c/root"), Path("/c/state"), Path("/c/containerd.sock"), Path("/c/cni"))
    config = tomllib.loads(text)
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == node.PAUSE_IMAGE
    assert cri["cni"]["conf_dir"] == "/c/cni"
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["Root"] == "/c/state/runc"
    assert (config["root"], config["state"], config["grpc"]["address"]) == ("/c/root", "/c/state", "/c/containerd.sock")


def test_image_references_are_named_as_containerd_stores_them():
    assert node.normalize("modelplex/router:0.1.0") == "docker.io/modelplex/router:0.1.0"
    assert node.normalize("busybox:1") == "docker.io/library/busybox:1"
    assert node.normalize("modelplex.local/pause:catatonit") == "modelplex.local/pause:catatonit"
    assert node.normalize("localhost:5000/x:1") == "localhost:5000/x:1"
