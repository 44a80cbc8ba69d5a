"""The maintained benchmarks (``benchmarks/``, not installed) as the package ``exhume_benchmarks``.

Opacus installs a top-level package named ``benchmarks``; a folder of ours by that name would be shadowed wherever
site-packages came first on ``sys.path``. So ``benchmarks/`` is no package, and this module makes it one under a name
no dependency takes: with the repository root on ``sys.path`` (the scripts put it there; pytest's ``pythonpath``),
``import exhume_benchmarks.zoo.zoo`` loads ``benchmarks/zoo/zoo.py``, whatever else is installed.
"""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parent / "benchmarks")]
