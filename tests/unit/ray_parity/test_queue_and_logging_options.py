"""Ray's ``max_queued_requests`` and ``logging_config`` deployment options (issue 40): accepted by
``@serve.deployment`` and ``.options`` with Ray's checks, written into the manifest
``modelplex build`` and ``serve.run`` write (``spec.router.maxQueuedRequests``, ``spec.logging``,
``spec.router.accessLog``), and applied by the components (the router's bound: the router
suite; the logs: here and ``tests/integration/ray_parity/test_backpressure.py``)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from modelplex import serve
from modelplex.logs import configure
from modelplex.serve.graph import manifest, walk
from modelplex.serve.schema import LoggingConfig
from modelplex.wire.spec import Logging, parse_deployment


@serve.deployment
class Model:
    def __call__(self) -> str:
        return "Hello world!"


def spec_of(deployment) -> dict:
    document = manifest(walk(deployment.bind())[0], image="registry.local/app:1", handler="app:Model")
    parse_deployment(document)  # what the operator will accept
    return document["spec"]


def test_max_queued_requests_becomes_the_routers_bound_and_rays_minus_one_no_bound():
    assert spec_of(Model.options(max_queued_requests=3))["router"] == {"maxQueuedRequests": 3}
    assert "router" not in spec_of(Model.options(max_queued_requests=-1))  # Ray's default: no bound
    assert "router" not in spec_of(Model)
    decorated = serve.deployment(max_queued_requests=10, max_ongoing_requests=2)(Model.func_or_class)
    assert spec_of(decorated)["router"] == {"maxQueuedRequests": 10}
    for bad in (0, -2, 1.5, True, "10"):
        with pytest.raises(ValueError, match=r"max_queued_requests must be -1 \(no limit\) or a positive integer"):
            Model.options(max_queued_requests=bad)


def test_rays_logging_config_example_sets_the_level_of_the_deployments_logs():
    """Ray's LoggingConfig docstring: ``@serve.deployment(logging_config=LoggingConfig(log_level="DEBUG"))``."""

    @serve.deployment(logging_config=LoggingConfig(log_level="DEBUG"))
    class MyDeployment:
        def __call__(self) -> str:
            return "Hello world!"

    spec = spec_of(MyDeployment)
    assert spec["logging"] == {"level": "DEBUG", "encoding": "TEXT"}
    assert spec["router"] == {"accessLog": True}  # Ray's enable_access_log defaults to True


def test_a_dict_takes_rays_keys_and_a_level_by_number():
    spec = spec_of(Model.options(logging_config={"log_level": logging.WARNING, "encoding": "json",
                                                 "enable_access_log": False}, max_queued_requests=4))
    assert spec["logging"] == {"level": "WARNING", "encoding": "JSON"}
    assert spec["router"] == {"accessLog": False, "maxQueuedRequests": 4}
    assert serve.LoggingConfig is LoggingConfig


def test_what_logging_config_cannot_map_is_refused_by_name_with_the_reason():
    with pytest.raises(ValueError, match="logs_dir is not supported by Modelplex: the router and the replicas log "
                                         "to stderr"):
        LoggingConfig(logs_dir="/my_dir")  # Ray's other docstring example
    with pytest.raises(ValueError, match="additional_log_standard_attrs is not supported"):
        Model.options(logging_config={"additional_log_standard_attrs": ["name"]})
    with pytest.raises(ValueError, match="log_level must be one of DEBUG, INFO"):
        Model.options(logging_config={"log_level": "LOUD"})
    with pytest.raises(ValueError, match="encoding must be TEXT or JSON"):
        Model.options(logging_config={"encoding": "XML"})
    with pytest.raises(TypeError, match="unknown field"):
        Model.options(logging_config={"level": "DEBUG"})
    with pytest.raises(TypeError, match="LoggingConfig or a dict"):
        Model.options(logging_config="DEBUG")


def a_logger() -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    root = logging.Logger("test-root", level=logging.INFO)
    root.addHandler(logging.StreamHandler(out))
    return root, out


def test_json_encoding_writes_one_object_a_line_with_rays_keys_and_the_level_applies():
    root, out = a_logger()
    configure(Logging(level="DEBUG", encoding="JSON"), root)
    root.debug("loaded %s", "model-1")
    try:
        raise ValueError("bad weights")
    except ValueError:
        root.exception("load failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{"))
    assert (first["levelname"], first["message"], first["name"]) == ("DEBUG", "loaded model-1", "test-root")
    assert {"asctime", "filename", "lineno"} <= set(first)
    assert second["message"] == "load failed" and "ValueError: bad weights" in second["exc_text"]


def test_text_encoding_and_no_level_keep_the_command_lines():
    root, out = a_logger()
    configure(Logging(), root)
    root.debug("hidden")
    root.info("shown")
    assert out.getvalue().split(" ", 2)[2] == "INFO test-root: shown\n"
