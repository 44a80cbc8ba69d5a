"""The maintained benchmarks import as ``exhume_benchmarks`` from anywhere: Opacus's top-level ``benchmarks`` cannot
stand in for them (exhume_benchmarks.py, benchmarks/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _extras import need

ROOT = Path(__file__).resolve().parents[1]


def _python(code_or_args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, *code_or_args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def test_the_benchmarks_import_from_outside_the_repository_root_beside_opacus(tmp_path):
    need("opacus", "dp")  # the distribution that installs a top-level package named benchmarks
    # the repository root last on sys.path, after site-packages: the name benchmarks is Opacus's, ours still loads
    code = (f"import sys; sys.path.append({str(ROOT)!r}); import benchmarks; import exhume_benchmarks.zoo.zoo as zoo; "
            "print(benchmarks.__file__); print(zoo.__file__); print(len(zoo.ZOO))")
    theirs, ours, count = _python(["-c", code], tmp_path).split()
    assert "site-packages" in Path(theirs).parts and Path(ours) == ROOT / "benchmarks" / "zoo" / "zoo.py" and int(count) > 10
    # a script run from another folder finds its siblings (variant_screen.py imports exhume_benchmarks.zoo.run)
    assert "--configs" in _python([str(ROOT / "benchmarks" / "variant_screen.py"), "--help"], tmp_path)
