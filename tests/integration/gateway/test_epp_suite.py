"""The black-box EPP suite (``tests/support/epp_suite``: ext_proc as a Gateway speaks it, no Envoy)
passes against Modelplex's Endpoint Picker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / "support" / "epp_suite"


def test_the_black_box_epp_suite_passes_against_the_picker(gateway):
    env = {**gateway.processes.env, "MODELPLEX_EPP_ADDRESS": gateway.picker,
           "MODELPLEX_EPP_ENDPOINTS": ",".join(gateway.replicas.values()), "MODELPLEX_EPP_MODEL": "suite-model",
           "MODELPLEX_EPP_FALLBACKS": "1",
           "MODELPLEX_EPP_HEADERS": json.dumps({"authorization": "Bearer alice-token-0123456789"})}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE)],
                         cwd=SUITE.parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "8 passed" in run.stdout, run.stdout[-3000:]
