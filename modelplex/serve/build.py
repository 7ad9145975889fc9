"""``modelplex build app.py:app`` and ``modelplex local app.py:app``: an application graph as manifests.

Each deployment of the graph becomes one MultiplexedDeployment whose handler
(:class:`~modelplex.serve.hosted.FromApp`) imports the application in the replica and builds
that deployment, with handles for its edges. The image must hold the application's module on
its import path (``MODELPLEX_SERVE_APP`` names it as ``module:attribute``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

from modelplex.serve import graph
from modelplex.serve.deployment import Application
from modelplex.serve.hosted import APP_HANDLER, ENV_APP, ENV_APP_DIR, ENV_APP_NAME, import_app
from modelplex.wire.spec import SpecError, parse_deployment

_APP_TARGET = re.compile(r"^(?P<path>[^:]+?)(?:\.py)?:(?P<attribute>[A-Za-z_]\w*)$")


def is_app_target(argument: str) -> bool:
    """``app.py:app`` or ``package.module:app`` (a manifest is a .yaml/.yml/.json file)."""
    return bool(_APP_TARGET.match(argument)) and not argument.endswith((".yaml", ".yml", ".json"))


def _locate(target: str) -> tuple[str, Path | None]:
    """``module:attribute`` and the folder to import it from (None: already on the path)."""
    match = _APP_TARGET.match(target)
    if match is None:
        raise SpecError([f"{target!r} is not an application: write it as app.py:app or package.module:app"])
    path, attribute = match["path"], match["attribute"]
    if target.split(":")[0].endswith(".py") or "/" in path:
        file = Path(path if path.endswith(".py") else path + ".py").resolve()
        if not file.is_file():
            raise SpecError([f"{target}: no file {file}"])
        return f"{file.stem}:{attribute}", file.parent
    return f"{path}:{attribute}", None


def documents(target: str, *, image: str, namespace: str | None = None, local: bool = False,
              name: str | None = None) -> list[dict[str, Any]]:
    """One MultiplexedDeployment per deployment of ``target``'s graph, ingress first; each is
    validated as the operator will validate it. ``local`` names the module's folder for the
    replica; ``name``, the application's, scopes the deployments' names (``graph.scoped``)."""
    app_target, folder = _locate(target)
    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        app = import_app(app_target)
    except LookupError as error:
        raise SpecError([f"{target}: {error}"]) from None
    if not isinstance(app, Application):
        raise SpecError([f"{target} is a {type(app).__name__}, not an application: bind it, "
                         "app = MyDeployment.bind(...)"])
    env = {ENV_APP: app_target}
    if local and folder is not None:
        env[ENV_APP_DIR] = str(folder)
    if name:
        env[ENV_APP_NAME] = name
    for variable in graph.unsupported_ray_environment(os.environ):
        print(f"modelplex build: {variable} has no effect in Modelplex", file=sys.stderr)
    result = []
    nodes = graph.walk(app)
    for node in nodes:
        try:
            document = graph.manifest(node, image=image, handler=APP_HANDLER, env=env, environ=os.environ,
                                      app_name=name, app=nodes)
        except ValueError as error:
            raise SpecError([str(error)]) from None
        if namespace:
            document["metadata"]["namespace"] = namespace
        if node.options.user_config is not None:
            document["spec"]["userConfig"] = _json_user_config(node)
        parse_deployment(document, source=f"{target} ({node.name})")  # SpecError names the field
        result.append(document)
    return result


def _json_user_config(node: graph.Node) -> Any:
    """``node``'s user_config as the manifest's ``spec.userConfig``: a change of it alone rolls no
    pod in a cluster, the operator gives it to the live replicas' ``reconfigure``. It must be
    JSON (Ray's must be too), and the deployment must have a ``reconfigure``."""
    if not callable(getattr(node.target, "reconfigure", None)):
        raise SpecError([f"{node.options.name}: has a user_config but no reconfigure(config) method"])
    try:
        return json.loads(json.dumps(node.options.user_config, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise SpecError([f"{node.options.name}: user_config must be JSON ({error})"]) from None


def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


@contextlib.contextmanager
def local_manifests(arguments: list[str]) -> Iterator[list[str]]:
    """``modelplex local``'s arguments with each application target written as a manifest (in a
    folder removed afterwards); manifests pass through as they are."""
    with tempfile.TemporaryDirectory(prefix="modelplex-app-") as folder:
        paths = []
        for index, argument in enumerate(arguments):
            if not is_app_target(argument):
                paths.append(argument)
                continue
            path = Path(folder) / f"app-{index}.yaml"
            path.write_text(dump(documents(argument, image="local", local=True)))
            paths.append(str(path))
        yield paths


def build(target: str, *, image: str, output: str = "-", namespace: str | None = None,
          name: str | None = None) -> int:
    """``modelplex build``: write the manifests to ``output`` ('-' for stdout); the exit code.
    ``name`` (the application's) scopes the deployments' names, so applications built into
    one namespace may share deployment names."""
    docs = documents(target, image=image, namespace=namespace, name=name)
    text = dump(docs)
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text)
        names = ", ".join(doc["metadata"]["name"] for doc in docs)
        print(f"modelplex build: {len(docs)} deployment(s) to {output}: {names}", file=sys.stderr)
    return 0
