"""The node tests' image, made here without docker: Debian's static busybox (``busybox-static``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from modelplex_cluster import node

BUSYBOX = "modelplex.local/busybox:e2e"
APPLETS = ("sh", "cat", "echo", "env", "id", "ls", "mkdir", "sleep", "touch", "true", "false", "grep",
           "httpd", "wget", "ssl_client", "nslookup", "hostname", "timeout")


def busybox_image() -> bytes:
    """An OCI archive of one binary and the applets the tests use, for ``ControlPlane.import_image``."""
    binary = shutil.which("busybox") or "/bin/busybox"
    files: dict[str, tuple[bytes | str, int]] = {"bin/busybox": (Path(binary).read_bytes(), 0o755)}
    files.update({f"bin/{applet}": ("busybox", 0) for applet in APPLETS})
    return node.oci_archive(BUSYBOX, files, {"Env": ["PATH=/bin"], "Cmd": ["sh"]})
