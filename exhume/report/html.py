"""``exhume report RUN``: one self-contained HTML page that a model owner can read offline.

The page is built from an evaluated attack run: ``RUN/reconstruction.json`` (the attack's
settings) and ``RUN/evaluation/`` (``metrics.json`` and the PNG figures written by
:func:`exhume.evaluation.run.evaluate`). Figures are embedded as base64 PNG ``data:`` URLs; the
page loads nothing from outside (no scripts, fonts or style sheets), and every piece of text that
comes from a file is escaped with :func:`html.escape`.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exhume.errors import ExhumeError
from exhume.files.runfolder import holding_output
from exhume.files.schemas import read_reconstruction_meta

BEST_PAIRS = ("best_pairs.png", "Best pairs",
              "Each triple: a training image | the attack's closest reconstruction | the closest of the unseen images, with "
              "their SSIM (1 = identical). Chosen by looking at the training set (oracle); * marks a memorised image.")
FIGURES = [
    ("ssim_sorted.png", "Sorted SSIM curve",
     "Each training image's best SSIM against the reconstructions (oracle: each training image picks its closest candidate), "
     "sorted; the dashed lines are the 0.4 and 0.5 thresholds."),
    ("ssim_vs_margin.png", "SSIM against the training margin",
     "Training images with small margins sit on the decision boundary and carry large multipliers; they are the ones the attack recovers."),
    BEST_PAIRS,
    ("worst_pairs.png", "Worst pairs (oracle-selected)",
     "The training images the attack recovered least well, with their closest reconstruction and unseen image."),
    ("candidates.png", "Reconstructions as the attacker sees them",
     "The attack's candidates, unsorted: this is all an attacker gets, with no training image to compare against."),
]

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1200px;margin:1.2em auto;padding:0 1.2em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.5em;margin:0 0 .1em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.first{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1.1fr);gap:1.6em;align-items:start;margin-top:1em}
@media (max-width:900px){.first{grid-template-columns:1fr}}
.verdict{border-left:6px solid #b00020;background:#fff4f4;padding:.6em 1em;margin:0 0 .8em}
.verdict.low{border-color:#2e7d32;background:#f3fbf3}.verdict.unsure{border-color:#b26a00;background:#fff8e6}
.verdict .word{font-size:1.5em;font-weight:700;margin:0 0 .2em;letter-spacing:.02em}.verdict p{margin:.3em 0}
.explain{font-size:.93em;margin:.4em 0}
dl.glossary{font-size:.9em;margin:.6em 0;color:#333}dl.glossary dt{font-weight:700;display:inline}dl.glossary dd{display:inline;margin:0}
dl.glossary dd:after{content:"";display:block;margin-bottom:.25em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.oracle{display:inline-block;font-size:.75em;font-weight:600;color:#6a1b9a;border:1px solid #6a1b9a;border-radius:3px;padding:0 .3em;margin-left:.4em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{color:#555;font-size:.92em}
#best-pairs{margin:0}
.note{color:#555;font-size:.92em}code{background:#f5f5f5;padding:0 .2em}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


def _rows(rows: list[tuple[str, Any, bool]]) -> str:
    out = []
    for label, value, oracle in rows:
        tag = '<span class="oracle" title="selected by looking at the training set">oracle</span>' if oracle else ""
        out.append(f"<tr><th>{_e(label)}{tag}</th><td class=\"num\">{_e(_fmt(value))}</td></tr>")
    return "<table>" + "".join(out) + "</table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def verdict(metrics: Mapping[str, Any]) -> tuple[str, bool]:
    """The plain-language verdict (text, leaks) from the evaluation metrics.

    The verdict itself (leaks / no evidence / inconclusive), its reason and the p-value are
    computed once, by :mod:`exhume.evaluation.verdict`, and stored in ``metrics.json``; this
    function words them. For a metrics.json written before the verdict was stored, the verdict
    is decided from its counts by :func:`exhume.evaluation.verdict.decide`, as the evaluation does.
    """
    text, leaks = explain(metrics)
    stated = metrics.get("verdict")
    return (f"Verdict: {stated.upper()}. " if stated and metrics.get("memorised") is not None else "") + text, leaks


def explain(metrics: Mapping[str, Any], failures: bool = True) -> tuple[str, bool]:
    """:func:`verdict`'s text without its first words; ``failures=False`` leaves out the failed assumptions
    (for a page that shows the stored reason, which lists them, beside it)."""
    from exhume.evaluation.verdict import ALPHA, decide

    n, k, pool = metrics.get("n_train"), metrics.get("memorised"), metrics.get("pool_size")
    c, nc = metrics.get("memorised_control"), metrics.get("control_size")
    s04, pool04, stated = metrics.get("ssim>=0.4"), metrics.get("pool_ssim>=0.4"), metrics.get("verdict")
    if k is None:
        return (f"No memorisation count: the run was evaluated without a pool of unseen images, so it cannot tell a "
                f"recovered training image from a merely plausible one. {s04} of {n} training images have a reconstruction "
                f"with SSIM ≥ 0.4, which alone is not proof of leakage. Re-run 'exhume evaluate' with --pool-size > 0.", False)
    text = (f"{k} of {n} training images can be recovered recognisably from the weights alone: for each of them the attack "
            f"produced an image that resembles it (SSIM) more closely than any of {pool} unseen images of the same classes does. ")
    alpha = metrics.get("alpha") or ALPHA
    if c is not None and nc:
        decided = decide(metrics, alpha=alpha)  # what the evaluation decides from these counts (stored since the verdict is)
        p = decided.p_value if metrics.get("p_value") is None else float(metrics["p_value"])
        leaks = (stated or decided.verdict) == "leaks"
        text += (f"The same test run on {nc} unseen images that were not in the training set (the control) passes for {c} of them "
                 f"(one-sided Fisher exact test: p = {p:.2g}, alpha = {alpha:g}). ") + _oracle_sentence(metrics)
    else:
        leaks = stated == "leaks"
        text += "No held-out control was measured for this run, so the comparison with non-members is missing. "
    if leaks:
        text += "This model leaks part of its training set. "
    elif stated == "inconclusive":
        text += ("Inconclusive: " + "; ".join(metrics.get("assumption_failures") or []) + ". ") if failures else ""
    elif k > 0:
        text += ("That is not clearly more than for non-members, so this run alone does not prove leakage; inspect the best "
                 "pairs (a longer attack may find more). ")
    else:
        text += "No evidence of leakage from this run (a stronger attack may still find some). "
    text += (f"Note that an SSIM ≥ 0.4 is not proof on its own: {s04} of {n} training images have a reconstruction at SSIM ≥ 0.4, "
             f"but the best unseen image already reaches it for {pool04} of {n}.")
    return text, leaks


def _oracle_sentence(metrics: Mapping[str, Any]) -> str:
    c, nc, oracle = metrics.get("memorised_control"), metrics.get("control_size"), metrics.get("memorised_control_oracle")
    if c and oracle:
        return (f"Some non-members look like members: the training images themselves, given as reconstructions, would pass "
                f"this test for {oracle} of the {nc} control images (oracle), so a faithful attack is expected to show a "
                f"control above zero. ")
    if c and oracle == 0:
        return ("The training images themselves, given as reconstructions, would pass this test for none of the control "
                "images (oracle): the control's matches are not look-alikes of members. ")
    return ""


def render(run: str | Path) -> str:
    """The report's HTML for an evaluated run folder: first the verdict beside the best pairs, then the numbers."""
    run = Path(run)
    ev = run / "evaluation"
    metrics, attack = _load(run, ev)
    parts = [_head(run, attack), _first_screen(metrics, attack, ev), _counts_section(metrics), _victim_section(metrics),
             _layers_section(metrics), _law_section(metrics), _dp_section(metrics), _attack_section(attack)]
    portfolio = (attack.get("config") or {}).get("portfolio")
    if isinstance(portfolio, dict):
        parts.append(_portfolio_section(portfolio, attack, metrics))
    parts.append(_membership_section(metrics, ev))
    parts.append(_figures_section(ev))
    parts.append("</body></html>")
    return "\n".join(parts)


def _load(run: Path, ev: Path):
    """metrics.json (checked against its type) and the attack's settings (from reconstruction.json when present)."""
    from exhume.evaluation.metrics import Metrics

    mpath = ev / "metrics.json"
    if not mpath.is_file():
        raise ExhumeError(f"{mpath} is missing; run 'exhume evaluate {run} --against VICTIM' first "
                          f"(or pass --against VICTIM to 'exhume report' to evaluate on the fly)")
    metrics = Metrics.read(mpath)
    attack = metrics.attack or {}
    rpath = run / "reconstruction.json"
    if rpath.is_file():
        meta = read_reconstruction_meta(rpath)
        attack = {"method": meta.get("method"), "seed": meta.get("seed"), "config": meta.get("config") or {}, **(meta.get("summary") or {})}
    return metrics, attack


def _head(run: Path, attack: dict[str, Any]) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, "
            f"initial-scale=1\"><title>exhume audit report: {_e(run.name)}</title><style>{CSS}</style></head><body>\n"
            f"<h1>Training-data reconstruction audit</h1><p class=\"note\">Run <code>{_e(run)}</code> · attack "
            f"<code>{_e(attack.get('method'))}</code> · generated by exhume</p>")


def _first_screen(metrics, attack: dict[str, Any], ev: Path) -> str:
    """What a reader came for: the verdict with its reason and what the words mean, beside the best pairs."""
    stated, reason = metrics.get("verdict"), metrics.get("verdict_reason")
    text, leaks = explain(metrics, failures=not reason)
    style = "" if leaks else (" unsure" if stated in ("inconclusive", None) else " low")
    word = stated.upper() if stated else ("LEAKS" if leaks else "not recorded (evaluated by an older exhume)")
    box = f"<div class=\"verdict{style}\"><p class=\"word\">Verdict: {_e(word)}</p>"
    box += (f"<p class=\"reason\">{_e(reason)}</p>" if reason else "") + "</div>"
    left = [f"<div id=\"verdict\">{box}<p class=\"explain\">{_e(text)}</p></div>", _glossary(metrics)]
    cfg = attack.get("config") or {}
    threat = metrics.get("threat_model") or cfg.get("threat_model")
    if threat:
        left.insert(1, f"<p class=\"threat\" id=\"threat-model\"><b>Threat model audited</b>: {_e(threat)}"
                    + ("" if threat == "weights only" else " (an attacker who has them; without them the verdict may differ)")
                    + ".</p>")
    left[1:1] = _owner_lines(metrics)
    if cfg.get("oracle_init"):
        left.append(f"<p class=\"verdict\">This run started from an oracle initialisation ({_e(cfg.get('init'))}) built from real "
                    "data: its numbers do not describe an attacker who has the weights only.</p>")
    fname, title, caption = BEST_PAIRS
    path = ev / fname
    right = (f"<figure id=\"best-pairs\">{_img(path, title)}<figcaption><b>{_e(title)}</b>. {_e(caption)}</figcaption></figure>"
             if path.is_file() else f"<p class=\"note\" id=\"best-pairs\">{_e(title)}: figure {_e(fname)} not found in {_e(ev)}.</p>")
    return f"<section class=\"first\" id=\"first-screen\"><div>{''.join(left)}</div>{right}</section>"


def _owner_lines(metrics) -> list[str]:
    """The first screen's identifiability and membership lines (the owner's audit; none when not measured)."""
    from exhume.evaluation.identifiability import identifiability_line

    out = []
    line = identifiability_line(metrics.get("identifiability"))
    if line:
        out.append(f"<p class=\"threat\" id=\"identifiability\"><b>Identifiability</b> (EVALUATOR, the equation at the "
                   f"training images): {_e(line)}.</p>")
    exposure = metrics.get("membership_exposure") or {}
    if exposure.get("finding"):
        out.append(f"<p class=\"threat\" id=\"membership-finding\">{_e(exposure['finding'])} "
                   "<a href=\"#membership-exposure\">ROC</a></p>")
    return out


def _membership_section(metrics, ev: Path) -> str:
    """Every membership score's AUC and TPR at low FPR with their intervals, and the log–log ROC."""
    exposure = metrics.get("membership_exposure") or {}
    if not exposure.get("scores"):
        return ""

    def cell(v: dict, pct: bool) -> str:
        f = (lambda a: f"{100 * a:.2f} %") if pct else (lambda a: f"{a:.3f}")
        return f"{f(v['value'])} [{f(v['ci95'][0])}, {f(v['ci95'][1])}]"

    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v['definition'])}</td><td>{cell(v['auc'], False)}</td>"
                   f"<td>{cell(v['tpr_at_0.01_fpr'], True)}</td><td>{cell(v['tpr_at_0.001_fpr'], True)}</td></tr>"
                   for k, v in exposure["scores"].items())
    path = ev / "membership_roc.png"
    fig = f"<figure>{_img(path, 'membership ROC')}<figcaption>ROC on log–log axes.</figcaption></figure>" if path.is_file() else ""
    return (f"<section id=\"membership-exposure\"><h2>Membership from the weights</h2><p>{exposure['n_members']} training "
            f"images against {exposure['n_nonmembers']} unseen images (their labels: {_e(exposure['nonmember_labels'])}); "
            f"95 % intervals from {_e(exposure['bootstrap'])}; the lowest FPR resolved is {exposure['lowest_fpr_resolved']:.2g}.</p>"
            f"<table><tr><th>score</th><th>definition</th><th>AUC</th><th>TPR at 1 % FPR</th><th>TPR at 0.1 % FPR</th></tr>"
            f"{rows}</table>{fig}</section>")


def _glossary(metrics) -> str:
    """What the verdict's words mean, one line each."""
    pool, nc = metrics.get("pool_size") or "the", metrics.get("control_size") or "some"
    terms = [("memorised", f"the attack's closest reconstruction of a training image resembles it more than any of {pool} "
                           "unseen images does: the image was recovered, not merely imitated."),
             ("control", f"the same test run on {nc} images the model never saw: how often chance alone passes it. The verdict "
                         "is leaks only when memorised is above the control by more than chance explains (p < alpha)."),
             ("oracle", "chosen by looking at the training images, which an attacker does not have (for display and upper "
                        "bounds only).")]
    return "<dl class=\"glossary\" id=\"glossary\">" + "".join(f"<dt>{_e(t)}</dt><dd>: {_e(d)}</dd>" for t, d in terms) + "</dl>"


def _counts_section(metrics) -> str:
    """The counts behind the verdict, and the membership AUC."""
    n = metrics.get("n_train")

    def of(key: str, total_key: str = "n_train"):
        value = metrics.get(key)
        return None if value is None else f"{value} / {metrics.get(total_key)}"

    rows = [
        ("training images (n)", n, False),
        ("candidates (reconstructions)", metrics.get("n_candidates"), False),
        ("MEMORISED: closer to a training image than every unseen image", f"{metrics.get('memorised')} / {n}", True),
        ("  control: the same count for unseen non-member images", of("memorised_control", "control_size"), False),
        ("  control if the candidates were the training images themselves (what a perfect reconstruction would score)",
         of("memorised_control_oracle", "control_size"), True),
        ("unseen pool", metrics.get("pool_description") or metrics.get("pool_size"), False),
        ("SSIM ≥ 0.4, one-to-one (Hungarian)", f"{metrics.get('one_to_one_ssim>=0.4')} / {n}", True),
        ("SSIM ≥ 0.5, one-to-one (Hungarian)", f"{metrics.get('one_to_one_ssim>=0.5')} / {n}", True),
        ("SSIM ≥ 0.4, nearest candidate", f"{metrics.get('ssim>=0.4')} / {n}", True),
        ("SSIM ≥ 0.5, nearest candidate", f"{metrics.get('ssim>=0.5')} / {n}", True),
        ("best unseen image reaches SSIM ≥ 0.4 (baseline)", f"{metrics.get('pool_ssim>=0.4')} / {n}", True),
        ("best unseen image reaches SSIM ≥ 0.5 (baseline)", f"{metrics.get('pool_ssim>=0.5')} / {n}", True),
        ("mean SSIM, nearest candidate", metrics.get("ssim_mean"), True),
        ("Spearman ρ, SSIM vs training margin", metrics.get("margin_spearman_rho"), False),
        ("training points carrying the equation (σ(−margin) participation ratio, an estimate of how many a kkt attack can recover)",
         metrics.get("support_estimate"), False),
        ("SSIM window", metrics.get("ssim_window"), False),
    ]
    out = ["<h2>Counts</h2><p class=\"note\">The attack used only the weights and public facts about the model. Every number below "
           "was measured afterwards by the evaluator, who has the training set. Numbers marked <span class=\"oracle\">oracle</span> "
           "were selected by looking at the training images (each picks its closest reconstruction), so they are upper bounds on "
           "what an attacker could single out unaided; the memorisation count controls for this with unseen images.</p>" + _rows(rows)]
    if metrics.get("membership_auc") is not None:
        out.append("<h2>Membership uncertainty</h2>" + _rows([("membership AUC (0.5 = cannot tell members from non-members)",
                                                               metrics["membership_auc"], False)]))
    else:
        out.append("<p class=\"note\" id=\"membership\">Membership uncertainty: not measured for this run.</p>")
    return "\n".join(out)


def _victim_section(metrics) -> str:
    victim = metrics.get("victim") or {}
    rows = [("architecture", victim.get("arch") or victim.get("model"), False), ("task", victim.get("task"), False),
            ("loss", victim.get("loss"), False), ("weight decay", victim.get("weight_decay"), False),
            ("train accuracy", victim.get("train_accuracy"), False), ("test accuracy", victim.get("test_accuracy"), False),
            ("final training loss", victim.get("final_loss"), False),
            ("relative stationarity residual", victim.get("stationarity_residual"), False), ("epochs", victim.get("epochs"), False),
            ("data", victim.get("data"), False)]
    rows += [(label, victim[key], False) for key, label in (("normalisation", "input normalisation"), ("positive_class", "positive class (+1)"),
             ("stationarity_limit", "stationarity residual limit"), ("stationarity_definition", "stationarity residual, definition"))
             if key in victim]
    if metrics.get("assumption_failures"):
        rows.append(("assumptions of the attack that fail", "; ".join(metrics["assumption_failures"]), False))
    return "<h2>The model (victim)</h2>" + _rows(rows)


def _layers_section(metrics) -> str:
    """Where the weights show the training inputs' span, layer by layer (an audit's ``layers``; nothing without one)."""
    layers = metrics.get("layers")
    if not isinstance(layers, dict) or not isinstance(layers.get("layers"), list):
        return ""
    n = layers.get("n")
    known = any(isinstance(r, dict) and isinstance(r.get("delta"), dict) for r in layers["layers"])  # the start known: Δ too
    head = ("<tr><th>weight layer</th><th>out × in</th><th>directions for 99.9 % of the energy</th><th>σ<sub>n+1</sub>/σ<sub>1</sub></th>"
            + ("<th>what training added, Δ = W − c·W<sub>start</sub>: directions for 99.9 %</th><th>Δ: σ<sub>n+1</sub>/σ<sub>1</sub></th>"
               if known else "") + "<th>pre-activations within 1e-2 of 0</th><th>training inputs outside the top-n row space (median)</th></tr>")
    body = []
    for r in layers["layers"]:
        if not isinstance(r, dict):
            continue
        delta = r.get("delta") if isinstance(r.get("delta"), dict) else {}
        cells = [r.get("name"), "×".join(str(d) for d in r.get("shape") or []), r.get("rank_999"), r.get("sigma_after_n"),
                 *((delta.get("rank_999"), delta.get("sigma_after_n")) if known else ()),
                 r.get("preactivations_within_0.01"), r.get("input_distance_median")]
        body.append("<tr>" + "".join(f"<td>{_e(_fmt(c))}</td>" for c in cells) + "</tr>")
    return (f"<h2 id=\"layers\">Where the weights show the training inputs' span (n = {_e(_fmt(n))})</h2><p class=\"note\">"
            + _e(layers.get("finding")) + " The spectra read the weights only; the pre-activations and distances are "
            "EVALUATOR-side (the training inputs); see docs/audit.md.</p><table>" + head + "".join(body) + "</table>")


def _law_section(metrics) -> str:
    """Where the model sits against the law of data reconstruction (an audit's ``law``; nothing without one)."""
    law = metrics.get("law")
    if not isinstance(law, dict):
        return ""
    rows = [("trained parameters p", law.get("p"), False), ("input dimension d", law.get("d"), False),
            ("training samples n", law.get("n"), False), ("p/(d·n)", law.get("p_over_dn"), False), ("regime", law.get("regime"), False),
            ("p counted as", law.get("p_counted"), False)]
    if isinstance(law.get("measured"), dict):
        rows.append(("the measured curve's reading", law["measured"].get("reading"), False))
    return ("<h2 id=\"law\">The law of data reconstruction</h2><p class=\"note\">" + _e(law.get("definition")) + "; see "
            "docs/audit.md.</p>" + _rows(rows))


def _dp_section(metrics) -> str:
    """What the audit says of a model trained with differential privacy (an audit's ``dp``; nothing without one): the
    informed adversary's measured success on this model beside the bound for its mechanism, one row each."""
    dp = metrics.get("dp")
    if not isinstance(dp, dict):
        return ""
    lines = dp.get("lines") if isinstance(dp.get("lines"), list) else [f"{k}: {v}" for k, v in dp.items() if not isinstance(v, dict)]
    rows = [(line.split(": ", 1)[0], line.split(": ", 1)[-1], False) for line in lines]
    return ("<h2 id=\"dp\">Differential privacy</h2><p class=\"note\">The model was trained with DP-SGD. The informed adversary "
            "(every training record but its target known) was run on this model; each success rate is set beside the bound for "
            "the same game and this model's mechanism; see docs/audit.md.</p>" + _rows(rows))


def _attack_section(attack: dict[str, Any]) -> str:
    cfg = {k: v for k, v in (attack.get("config") or {}).items() if k != "portfolio"}
    rows = [("method", attack.get("method"), False), ("seed", attack.get("seed"), False),
            ("iterations run", attack.get("iterations"), False), ("seconds", attack.get("seconds"), False),
            ("final relative stationarity residual", attack.get("final_relative_stationarity"), False)]
    rows += [(k, v, False) for k, v in sorted(cfg.items())]
    return "<h2>Attack settings</h2>" + _rows(rows)


def _figures_section(ev: Path) -> str:
    parts = ["<h2>More figures</h2>"]
    for fname, title, caption in FIGURES:
        if fname == BEST_PAIRS[0]:
            continue  # on the first screen
        p = ev / fname
        if p.is_file():
            parts.append(f"<figure>{_img(p, title)}<figcaption><b>{_e(title)}</b>. {_e(caption)}</figcaption></figure>")
        else:
            parts.append(f"<p class=\"note\">{_e(title)}: figure {_e(fname)} not found in {_e(ev)}.</p>")
    return "\n".join(parts)


def _portfolio_section(portfolio: dict[str, Any], attack: dict[str, Any], metrics: dict[str, Any]) -> str:
    """The restarts of a pooled run: each one's seed, variant and budget, starved ones, and who found what."""
    from exhume.portfolio.report import restart_rows, sizing_line, starved_warnings

    per = metrics.get("memorised_per_restart") or []
    head = ["restart", "seed", "variant", "iterations", "seconds", "stationarity", "status"] + (["memorised (own candidates)"] if per else [])
    body = []
    for i, row in enumerate(restart_rows(portfolio)):
        cells = [row[h] for h in head[:7]] + ([per[i] if i < len(per) else None] if per else [])
        starved = row["restart"] in (attack.get("starved_restarts") or [])
        body.append("<tr" + (' class="starved"' if starved else "") + ">" + "".join(
            f"<td class=\"num\">{_e(_fmt(c))}{' (starved)' if starved and j == 3 else ''}</td>" for j, c in enumerate(cells)) + "</tr>")
    out = [f"<h2 id=\"restarts\">Restarts</h2><p class=\"note\">This result pools {_e(attack.get('candidates'))} candidates from "
           f"{_e(attack.get('restarts_complete'))} of {_e(attack.get('restarts'))} restarts of the attack "
           f"({_e(attack.get('candidates_before_merge'))} before near-duplicates were merged: {_e(portfolio.get('merge'))}). "
           f"Candidates are sorted by an attacker-side rank ({_e(portfolio.get('rank'))}).</p>",
           "<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" + "".join(body) + "</table>"]
    if sizing_line(portfolio):
        out.insert(1, f"<p class=\"note\" id=\"sizing\">{_e(sizing_line(portfolio))}.</p>")
    for line in starved_warnings(attack):
        out.append(f"<p class=\"verdict\" id=\"starved\">{_e(line)}</p>")
    hist = metrics.get("memorised_found_by")
    if hist is not None:
        text = ", ".join(f"{v} by {k} restart{'s' if k != '1' else ''}" for k, v in hist.items()) or "none"
        out.append(f"<p id=\"found-by\">Memorised training images found by how many restarts (each restart's own candidates "
                   f"against the same unseen pool): {_e(text)}. The control count above is computed on the pooled candidates, "
                   f"so pooling cannot add matches on non-members unseen.</p>")
    return "\n".join(out)


@holding_output(lambda a: a["out"] or Path(a["run"]) / "report.html", file=True)  # the run folder's lock
def write_report(run: str | Path, out: str | Path | None = None, against: str | Path | None = None,
                 pool_size: int = 1000) -> Path:
    """Write ``RUN/report.html`` (or ``out``); with ``against``, evaluate the run first if needed."""
    run = Path(run)
    if not run.is_dir():
        raise ExhumeError(f"{run} is not a folder; expected an attack run folder written by 'exhume attack'")
    if (run / "victim.json").is_file() and not (run / "reconstruction.json").is_file():
        raise ExhumeError(f"{run} is a victim folder (written by 'exhume train'), not an attack run; the report takes an attack "
                          f"run folder: 'exhume attack {run} -o RUN', then 'exhume evaluate RUN --against {run}' and "
                          "'exhume report RUN' (or 'exhume report RUN --against VICTIM' in one step)")
    if not (run / "evaluation" / "metrics.json").is_file() and against is not None:
        import exhume

        recon = exhume.load_reconstruction(run)
        victim = exhume.load_victim(against)
        exhume.evaluate(recon, victim, pool_size=pool_size, out=run / "evaluation")
    page = render(run)
    out = Path(out) if out is not None else run / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out
