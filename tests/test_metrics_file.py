"""metrics.json as a typed record: its keys kept, its schema taken from the type, older files read."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import exhume
from exhume.attacks import Reconstruction, RunRecord
from exhume.errors import ExhumeError
from exhume.evaluation import EvalResult, evaluate_images
from exhume.evaluation.metrics import Metrics
from exhume.files.records import entry
from exhume.report import render

DATA = Path(__file__).parent / "data"

#: the keys, in order, that metrics.json held before its fields were typed (written by the earlier code for the
#: same two evaluations as below); a key may be added at the end of a group, never dropped or renamed
POOLED_KEYS = [
    "n_train", "n_candidates", "pool_size", "ssim_window", "match_rule", "ssim>=0.4", "ssim>=0.5", "ssim_mean",
    "ssim_median", "one_to_one_ssim>=0.4", "one_to_one_ssim>=0.5", "one_to_one_ssim_mean", "one_to_one_matched",
    "distinct_candidates_matched", "pool_exact_copies_of_train", "memorised", "memorised_note",
    "memorised_if_candidates_were_real_unseen_images", "pool_ssim>=0.4", "pool_ssim>=0.5", "pool_ssim_mean",
    "pool_ssim_median", "margin_n", "margin_spearman_rho", "margin_spearman_p", "support_estimate",
    "margin_median_memorised", "margin_median_not_memorised", "memorised_per_restart", "memorised_found_by",
    "memorised_found_by_note", "memorised_control", "control_size", "one_to_one_ssim>=0.4_control",
    "memorised_control_note", "control_exact_copies_of_train", "memorised_control_oracle",
    "memorised_control_oracle_note", "pool_description", "membership_auc", "membership", "attack", "victim", "verdict",
    "verdict_reason", "p_value", "alpha", "verdict_test", "assumption_failures", "evaluation_seconds",
]
L2_KEYS = [
    "n_train", "n_candidates", "pool_size", "ssim_window", "match_rule", "match_downsample", "ssim>=0.3", "ssim>=0.4",
    "ssim>=0.5", "ssim_mean", "ssim_median", "one_to_one_ssim>=0.3", "one_to_one_ssim>=0.4", "one_to_one_ssim>=0.5",
    "one_to_one_ssim_mean", "one_to_one_matched", "distinct_candidates_matched", "memorised", "memorised_note",
]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A pooled reconstruction of two restarts (five exact training images, five noise) judged on plain arrays."""
    out = tmp_path_factory.mktemp("metrics")
    rng = np.random.default_rng(0)
    train, unseen = rng.random((10, 8, 8)).astype(np.float32), rng.random((60, 8, 8)).astype(np.float32)
    cands = np.concatenate([train[:5], rng.random((5, 8, 8)).astype(np.float32)])[:, None]
    members = torch.zeros(10, 2, dtype=torch.bool)
    members[:6, 0] = members[4:, 1] = True
    recon = Reconstruction("kkt", torch.from_numpy(cands), torch.ones(10), None,
                           RunRecord(final_relative_stationarity=0.01, settings={"pair": (1, 2)}), 0, provenance={"members": members})
    result = exhume.evaluate(recon, train=(train, None), unseen=unseen, margins=np.linspace(-1, 2, 10), out=out / "pooled",
                             figures=False)
    images = evaluate_images(torch.from_numpy(cands), train, match="l2", thresholds=(0.3, 0.4, 0.5))
    images.save(out / "l2")
    return {"out": out, "result": result, "images": images}


def test_metrics_json_keeps_its_keys(evaluated):
    """The same keys in the same order as before the fields were typed, with the values the attributes hold."""
    out = evaluated["out"]
    pooled = json.loads((out / "pooled" / "metrics.json").read_text())
    assert list(pooled) == POOLED_KEYS
    assert list(json.loads((out / "l2" / "metrics.json").read_text())) == L2_KEYS
    m = evaluated["result"].metrics
    assert pooled["verdict"] == m.verdict == "inconclusive" and pooled["memorised"] == m.memorised == 7
    assert pooled["verdict_reason"] == m.verdict_reason and "pool holds only 50" in m.assumption_failures[0]
    assert pooled["ssim>=0.4"] == m.ssim_at[0.4] == m["ssim>=0.4"] and m.thresholds == [0.4, 0.5]
    assert pooled["one_to_one_ssim>=0.4_control"] == m.one_to_one_control
    assert pooled["attack"]["config"] == {"pair": [1, 2]} and pooled["memorised_per_restart"] == [7, 2]
    assert dict(m) == {**pooled, "evaluation_seconds": m.evaluation_seconds}
    assert (out / "pooled" / "arrays.npz").is_file() and not list((out / "pooled").glob(".*.tmp"))


def test_metrics_mapping_and_round_trip(evaluated, tmp_path):
    """Read back equal to what was written; keys no field declares are kept and written last; a dict still makes an EvalResult."""
    m = Metrics.read(evaluated["out"] / "pooled" / "metrics.json")
    assert dict(m) == dict(evaluated["result"].metrics) and m.p_value == evaluated["result"].metrics.p_value
    m["my_note"] = "kept"
    m["ssim>=0.7"] = 1
    assert m.extra == {"my_note": "kept"} and m.ssim_at[0.7] == 1
    m.write(tmp_path / "metrics.json")
    again = json.loads((tmp_path / "metrics.json").read_text())
    assert list(again)[-1] == "my_note" and again["ssim>=0.7"] == 1
    plain = EvalResult(metrics={"n_train": 3, "memorised": np.int64(2), "ssim>=0.4": 1, "custom": [1.5]})
    assert isinstance(plain.metrics, Metrics) and plain.metrics.ssim_at == {0.4: 1} and plain.metrics["custom"] == [1.5]
    plain.save(tmp_path / "plain")
    assert json.loads((tmp_path / "plain" / "metrics.json").read_text())["memorised"] == 2


@pytest.mark.parametrize("key, value, expected", [
    ("memorised", "5", "expected an integer, got str '5'"),
    ("n_train", -1, "expected an integer in [0, 10000000]"),
    ("verdict", "maybe", "expected one of 'leaks', 'no evidence', 'inconclusive'"),
    ("p_value", "small", "expected a number, got str"),
    ("alpha", 1.5, "expected a number in [0.0, 1.0]"),
    ("assumption_failures", "none", "expected a list"),
    ("assumption_failures", [1], "item 0: expected a string"),
    ("memorised_found_by", {"1": 2.5}, "item '1': expected an integer"),
    ("ssim>=0.4", 1.5, "expected an integer"),
    ("ssim>=0.40", 1, "expected a threshold written like 0.4"),
    ("pool_ssim>=1e999", 1, "expected a threshold written like 0.4"),
    ("attack", [], "expected an object"),
    ("memorised_control", 30, "expected at most control_size = 20"),
    ("one_to_one_ssim>=0.5", 11, "expected at most n_train = 10"),
])
def test_the_schema_from_the_type_refuses_a_wrong_typed_field(evaluated, tmp_path, key, value, expected):
    data = json.loads((evaluated["out"] / "pooled" / "metrics.json").read_text())
    data.update({key: value, "control_size": 20})
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ExhumeError) as err:
        Metrics.read(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: field {key!r}: ") and expected in msg, msg


def test_a_first_release_metrics_json_loads_and_reports(tmp_path):
    """Written before the control, the verdict and membership existed: new fields None, old keys kept, a report."""
    m = Metrics.read(DATA / "metrics_first_release.json")
    assert m.verdict is None and m.memorised_control is None and m.membership_auc is None and m.support_estimate is None
    assert m.memorised == 0 and m.ssim_at == {0.4: 0, 0.5: 0} and list(m.extra) == ["memorised_expected_by_chance"]
    assert m.get("verdict") is None and "verdict" not in m
    (tmp_path / "run" / "evaluation").mkdir(parents=True)
    shutil.copy(DATA / "metrics_first_release.json", tmp_path / "run" / "evaluation" / "metrics.json")
    page = render(tmp_path / "run")
    assert "0 of 20 training images can be recovered recognisably" in page and "No held-out control was measured" in page


def test_a_field_is_one_line():
    """A record with one more field writes it, reads it back, checks its type and leaves older files readable."""

    @dataclasses.dataclass(eq=False)
    class More(Metrics):
        threat_model: str | None = entry(omit_none=True, choices=("weights only", "known start"))

    m = More(n_train=4, threat_model="weights only")
    assert m["threat_model"] == "weights only" and list(m)[-1] == "threat_model"
    assert More.from_dict(dict(m)).threat_model == "weights only"
    assert More.from_dict({"n_train": 4}).threat_model is None
    with pytest.raises(ExhumeError, match="field 'threat_model': expected one of"):
        More.from_dict({"n_train": 4, "threat_model": "everything"}, "metrics.json")
