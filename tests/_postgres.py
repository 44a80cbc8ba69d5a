"""The scratch PostgreSQL database the shared-study tests use (``.ci/run`` starts one)."""

from __future__ import annotations

import os

from _extras import missing


def postgres_dsn() -> str:
    """``EXHUME_TEST_POSTGRES``; without it the test skips, or fails when ``CI`` is set."""
    dsn = os.environ.get("EXHUME_TEST_POSTGRES")
    if dsn:
        return dsn
    missing("EXHUME_TEST_POSTGRES is not set (a postgresql:// URL of a scratch database; .ci/run starts one)")
