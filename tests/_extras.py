"""Tests that need an optional extra (``pip install 'exhume[tune]'``, ``exhume[test-extra]``) or a service CI
provides: without it they skip with the reason, or fail when ``CI`` is set (``.ci/run`` installs everything)."""

from __future__ import annotations

import importlib
import os

import pytest


def missing(reason: str):
    """Skip the test with ``reason``; under ``CI`` fail it instead (nothing may be missing there)."""
    if os.environ.get("CI"):
        pytest.fail(reason + " (CI must provide it: .ci/run)")
    pytest.skip(reason + "; set CI=1 to make this a failure", allow_module_level=True)


def need(module: str, extra: str):
    """The module ``module`` of the extra ``exhume[extra]``, imported; without it :func:`missing`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(f"{module} is not installed (pip install 'exhume[{extra}]')")
