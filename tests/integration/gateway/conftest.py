"""The package's stack (:func:`support.gateway_stack.start_stack`): one deployment behind a real
Envoy on ``ORIGINAL_DST``, one listener per body mode, shared by the Gateway tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from support.gateway_stack import Gateway, start_stack
from support.servers import Processes


@pytest.fixture(scope="package")
def gateway(tmp_path_factory) -> Iterator[Gateway]:
    processes = Processes(tmp_path_factory.mktemp("gateway"))
    try:
        yield start_stack(processes)
    finally:
        processes.stop_all()


