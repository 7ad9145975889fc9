"""Local mode refuses what the cluster refuses, with the operator's message and a non-zero exit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from unit.operator.objects import body

from modelplex.wire.spec import SpecError
from modelplex_launcher.local import run_local
from modelplex_operator.validation import problems_of, validate


@pytest.mark.parametrize("name", ["1recs", "Recs", "recs_a", "r" * 51, "-recs"])
def test_a_name_the_cluster_refuses_is_refused_by_local_mode_with_the_same_message(name, tmp_path: Path, capsys):
    document = body(name=name)
    with pytest.raises(SpecError) as refused:
        validate(document)
    cluster_message = problems_of(refused.value)
    manifest = tmp_path / "recs.yaml"
    manifest.write_text(json.dumps(document))  # JSON is YAML

    code = run_local([str(manifest)], port=0)

    assert code != 0
    err = capsys.readouterr().err
    assert cluster_message.startswith("metadata.name: ")
    assert f"{manifest}: {cluster_message}" in err, err

