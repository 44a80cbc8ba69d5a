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
