"""benchmarks/gpu/run.py at its tiny size on CPU: every victim trained, attacked by exhume (restarts batched, the
path a GPU takes) and by the reference recipe, judged, and one table written."""

from __future__ import annotations

import json

import pytest

from exhume_benchmarks.gpu import run as bench

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_gpu_benchmark_runs_at_its_tiny_size(tmp_path):
    assert bench.main(["--tiny", "--out", str(tmp_path), "--attack-seconds", "1", "--train-scale", "0.5"]) == 0
    got = json.loads((tmp_path / "results.json").read_text())
    rows = got["rows"]
    assert [(r["victim"], r["method"]) for r in rows] == [(c.name, m) for c in bench.TINY for m in ("exhume", "reference")]
    for r in rows:
        assert 0 <= r["memorised"] <= r["n"] and 0 <= r["one_to_one"] <= r["n"] and r["control"] is not None
        assert r["iterations"] > 0 and r["it_per_s"] > 0 and r["attack_wall_s"] > 0 and r["budget_s"] == 1.0
        assert r["batched"] is (True if r["method"] == "exhume" else None)  # --tiny takes the batched path on CPU
        assert r["restarts"] == (2 if r["method"] == "exhume" else 1)
    table = (tmp_path / "table.md").read_text()
    assert "| victim | n | method | memorised | control |" in table and table.count("\n| ") == 1 + len(rows)  # the header, then one line per row
    assert got["meta"]["device"] == "cpu" and (tmp_path / "victims" / "cnn-wd5e-3").is_dir()
