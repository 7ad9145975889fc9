"""What Ray users' code imports and passes keeps working (issue 31, items 3 and 4): Starlette's
requests module after ``from modelplex import serve``, Ray's environment variables honoured
or named, and ``serve.run``'s Ray signature."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from modelplex import serve
from modelplex.serve.graph import ray_environment, unsupported_ray_environment


def test_starlette_requests_is_importable_after_importing_serve():
    """The multiplexing documents' own type hint: `import starlette` then `starlette.requests.Request`
    (under Ray, Serve's HTTP layer has imported it already)."""
    code = ("from modelplex import serve\nimport starlette\n"
            "async def __call__(self, request: starlette.requests.Request): pass\n"
            "print(starlette.requests.Request.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Request"


def test_rays_matching_timeout_is_honoured_and_a_bad_value_refused_by_name():
    assert ray_environment({}) == {}
    assert ray_environment({"RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S": "0.25"}) == \
        {"multiplexing": {"matchingTimeoutSeconds": 0.25}}
    for bad in ("-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match="RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S"):
            ray_environment({"RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S": bad})


def test_rays_variables_without_an_equivalent_are_named_never_silently_ignored():
    environ = {"RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S": "1", "RAY_SERVE_ENABLE_TASK_EVENTS": "1",
               "RAY_ADDRESS": "auto", "PATH": "/bin"}
    assert unsupported_ray_environment(environ) == ["RAY_SERVE_ENABLE_TASK_EVENTS"]


def test_serve_run_takes_rays_name_and_route_prefix_and_refuses_what_it_does_not_take():
    parameters = inspect.signature(serve.run).parameters
    assert parameters["name"].default == "default" and parameters["route_prefix"].default == "/"
    assert parameters["logging_config"].default is None
    with pytest.raises(TypeError, match="_local_testing_mode"):
        serve.run(object(), _local_testing_mode=True)  # Ray's, not taken here: refused by name
    with pytest.raises(ValueError, match="non-empty string"):
        serve.run(object(), name="")
    with pytest.raises(ValueError, match="route_prefix must start with '/'"):
        serve.run(object(), route_prefix="api")
    assert serve.status().applications == {}
