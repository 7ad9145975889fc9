"""`import operator` from the repository root must still be the standard library's."""

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_operator_from_the_repository_root_is_the_standard_library():
    where = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(where).parent == Path(sysconfig.get_paths()["stdlib"])
    assert not (ROOT / "operator" / "__init__.py").exists()
