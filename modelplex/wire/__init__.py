"""The contracts that cross a process boundary: the manifest (``spec``), names, headers and
annotations (``names``), the error body (``errors``), model ids (``ids``), the loaded-models
document (``loaded``), call envelopes (``codec``), the Open Inference Protocol (``oip``), route
prefixes (``forwarded``), how a failed stream ends (``streams``) and local mode's ready file
(``ready``).

A change here is a change of protocol between the operator, routers, replicas, handles and
local mode. These modules import nothing of the project but each other (an import-linter
contract in ``pyproject.toml`` checks it).
"""
