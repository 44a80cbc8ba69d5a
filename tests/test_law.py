"""The audit places the model on the law of data reconstruction: p trained parameters against d·n."""

from __future__ import annotations

import torch
from _start_cases import fine_tuned
from torch import nn

from exhume.audit.command import law_line
from exhume.audit.law import law_record


def test_the_trained_parameters_leave_out_what_the_start_shows_frozen():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 500, bias=False), nn.ReLU(), nn.Linear(500, 1, bias=False))
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    with torch.no_grad():
        model[3].weight.add_(1.0)  # only the readout trained
    known = law_record(model, start, (1, 8, 8), 4)
    unknown = law_record(model, None, (1, 8, 8), 4)
    assert (known["p"], known["d"], known["n"]) == (500, 64, 4) and known["p_over_dn"] == round(500 / 256, 4)
    assert unknown["p"] == 500 + 64 * 500 and "no start" in unknown["p_counted"]
    assert known["regime"].startswith("above") and law_record(model, start, (1, 8, 8), 40)["regime"].startswith("below")


def test_an_audit_writes_where_the_model_sits_in_metrics_summary_and_report(tmp_path):
    import exhume
    from exhume.evaluation.metrics import Metrics

    model, start, x = fine_tuned()
    unseen = torch.rand(60, 1, 4, 4, generator=torch.Generator().manual_seed(5))
    got = exhume.audit(model, (x, torch.tensor([1, 0, 1, 0])), unseen, start=start, out=tmp_path, loss="logistic",
                       weight_decay=1e-3, normalize=(0.5, 1.0), progress=False, force=True,
                       attack_args={"restarts": 1, "iterations": 20})
    law = got.metrics["law"]
    p = sum(v.numel() for v in model.parameters())  # every parameter was fine-tuned
    assert (law["p"], law["d"], law["n"]) == (p, 16, 4) and law["p_over_dn"] == round(p / 64, 4)
    assert Metrics.read(tmp_path / "evaluation" / "metrics.json")["law"] == law
    assert "The law of data reconstruction" in (tmp_path / "report.html").read_text()
    assert law_line(law).startswith(f"law: p = {p:,} trained parameters, d = 16, n = 4, p/(d·n) = ")
    # a two-layer MLP at p/(d·n) = 18: beyond the measured curve, which says so instead of extrapolating
    assert law["measured"]["status"] == "outside the measured range" and "no extrapolation" in law_line(law)
    html = (tmp_path / "report.html").read_text()
    assert "the measured curve&#x27;s reading" in html or "the measured curve's reading" in html


def _table():
    points = [{"family": f, "variant": v, "p_over_dn": r, "fraction": fr} for f in ("random-features", "two-layer-mlp")
              for v in ("learned", "closed-form") for r, fr in ((0.25, 0.0), (1.0, 0.1), (4.0, 0.4), (16.0, 0.8))]
    return {"points": points, "method": "kkt", "task": "binary", "variants": {"learned": {}, "closed-form": {"multipliers": "closed-form", "lr": 0.03}},
            "measured_on": "8x8 digits", "date": "2026-11-27", "command": "exhume experiment law"}


def test_the_measured_reading_reads_the_curve_within_its_range_and_refuses_outside_it():
    from exhume.audit.law import measured_reading

    def read(ratio, family="two-layer-mlp", start=True, method="kkt", args=None, task="binary"):
        return measured_reading({"p_over_dn": ratio}, family, start, method, args or {}, table=_table(), task=task)

    at = read(4.1)
    assert at["status"] == "read" and at["percent"] == [40, 40] and at["at_ratios"] == [4.0, 4.0]
    assert "recovered 40 % of training sets like yours" in at["reading"] and "2026-11-27" in at["reading"]
    between = read(2.0)
    assert between["percent"] == [10, 40] and between["at_ratios"] == [1.0, 4.0] and "10–40 %" in between["reading"]
    assert read(2.0, args={"multipliers": "closed-form"})["formulation"] == "closed-form"
    assert read(2.0, args={"multipliers": "learned"})["formulation"] == "learned"
    assert read(40.0)["status"] == read(0.1)["status"] == "outside the measured range"
    assert "no extrapolation" in read(40.0)["reading"]
    assert read(2.0, family=None)["status"] == read(2.0, family="cnn")["status"] == "family not measured"
    assert read(2.0, start=False)["status"] == "no start"
    assert read(2.0, method="bilevel")["status"] == "method not measured"
    assert read(2.0, task="multiclass")["status"] == "task not measured"


def test_the_shipped_curve_is_readable_and_names_how_it_was_measured():
    from exhume.audit.law import MEASURED, load_measured

    table = load_measured()
    assert table["command"].startswith("exhume experiment law") and table["date"] and "digits" in table["measured_on"]
    assert {p["family"] for p in table["points"]} == {"random-features", "two-layer-mlp", "cnn"}
    assert all(0 <= p["fraction"] <= 1 for p in table["points"]) and MEASURED.name == "law_measured.json"


def test_the_family_is_read_from_the_structure_and_what_the_start_shows_trained():
    from exhume.victim.law import build, family_of, width_for

    shape = (1, 8, 8)
    rf, mlp, cnn = (build(f, shape, 6) for f in ("random-features", "two-layer-mlp", "cnn"))
    start = {k: v.detach().clone() for k, v in rf.state_dict().items()}
    with torch.no_grad():
        rf[3].weight.add_(1.0)
    assert family_of(rf, start) == "random-features" and family_of(rf, None) == "two-layer-mlp"
    assert family_of(mlp, {k: v + 1 for k, v in mlp.state_dict().items()}) == "two-layer-mlp"
    assert family_of(cnn, None) == "cnn"
    deep = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    tanh = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 1))
    assert family_of(deep, None) is None and family_of(tanh, None) is None
    for family in ("random-features", "two-layer-mlp", "cnn"):
        for ratio in (0.5, 4.0):
            p = sum(v.numel() for v in build(family, shape, width_for(family, shape, 5, ratio)).parameters() if v.requires_grad)
            assert 0.6 < p / (64 * 5 * ratio) < 1.6
