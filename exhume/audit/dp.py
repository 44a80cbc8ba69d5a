"""What an audit says of a model trained with differential privacy (``exhume audit --dp-epsilon E [--dp-delta D]``).

Three things beside the verdict (``metrics.json``'s ``dp``, the printed summary, the report):

- the measured curve's reading at the user's ε: what exhume recovered from models trained with
  DP-SGD at the same or neighbouring ε (``dp_measured.json``, shipped with the package, written by
  ``exhume experiment dp`` at its CPU default): the setting whose threat model matches the audit's
  (the start known: the mini-batch MLP; weights only: the demo's full-batch victim), the nearest
  measured ε or the two around it, never extrapolated outside the measured range;
- the bound for an informed adversary from (ε, δ) alone, Balle, Cherubin and Hayes (2022):
  γ = e^ε·κ + δ (:func:`exhume.victim.rero.dp_bound`), κ this audit's own control match rate
  (the upper end of its 95 % interval): the chance that a record the model never saw is matched;
- what the verdict means at that ε: a "no evidence" is this attack's failure within its budget,
  not a proof that nothing can be reconstructed; a "leaks" is a reconstruction the guarantee allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exhume.audit.curve import load_curve, read_at

#: the measured curve the audit reads (``dp-curve.json`` of ``exhume experiment dp`` at its CPU default)
MEASURED = Path(__file__).with_name("dp_measured.json")
#: an ε within this factor of a measured one reads that point alone
SAME_EPSILON = 1.1
LEVELS_NOT_PRIVATE = ("none", "clip")


def load_measured(path: Path = MEASURED) -> dict[str, Any]:
    """The measured curve (checked: its points and provenance)."""
    return load_curve(path, "the DP measured curve (dp-curve.json of exhume experiment dp)",
                      ("points", "settings", "measured_on", "date", "command"))


def setting_for(start_known: bool, table: dict[str, Any]) -> str | None:
    """The measured setting whose threat model is the audit's (start known or weights only), or None."""
    return next((name for name, s in table["settings"].items() if bool(s.get("start_known")) == start_known), None)


def measured_reading(epsilon: float, start_known: bool, table: dict[str, Any] | None = None, method: str | None = None) -> dict[str, Any]:
    """``{"status", "reading", …}``: the measured memorised fraction at ``epsilon`` (status ``"read"``, with ``percent``
    low and high, ``at_epsilons`` and the non-private value), or why there is none (another attack than ``method``
    measured, the threat model not measured, ``epsilon`` outside the measured range, no curve)."""
    from exhume.errors import DataError

    try:
        table = load_measured() if table is None else table
    except DataError as e:
        return {"status": "no measured curve", "reading": f"no measured reading: {e}"}
    source = {k: table[k] for k in ("measured_on", "date", "command")}
    if method is not None and method != table.get("method", method):
        return {"status": "method not measured", "reading": f"no measured reading: the curve was measured with "
                f"{table['method']}, not with {method} as run here", **source}
    setting = setting_for(start_known, table)
    points = sorted((p for p in table["points"] if p["setting"] == setting and p["level"] not in LEVELS_NOT_PRIVATE),
                    key=lambda p: p["epsilon"])
    if setting is None or not points:
        threat = "the start known" if start_known else "the weights alone"
        return {"status": "threat model not measured", "reading": f"no measured reading: no DP victim was measured with {threat}",
                **source}
    lo, hi = points[0]["epsilon"], points[-1]["epsilon"]
    if not lo / SAME_EPSILON <= epsilon <= hi * SAME_EPSILON:
        return {"status": "outside the measured range", "reading": f"no measured reading: ε = {epsilon:g} lies outside the "
                f"measured {lo:g}–{hi:g}: no extrapolation", "setting": setting, **source}
    return _read(points, epsilon, setting, table, source)


def _read(points: list[dict], epsilon: float, setting: str, table: dict, source: dict) -> dict[str, Any]:
    percent, at, amount = read_at(points, "epsilon", epsilon, SAME_EPSILON)
    where = f"at ε = {at[0]:.3g}" if at[0] == at[1] else f"between ε = {at[0]:.3g} and {at[1]:.3g}"
    plain = next((p for p in table["points"] if p["setting"] == setting and p["level"] == "none"), None)
    versus = "" if plain is None else f", against {round(100 * plain['fraction'])} % trained without privacy"
    what = table["settings"][setting].get("what", setting)
    text = (f"exhume memorised {amount} of the training images of DP-SGD models like yours {where} ({what}{versus}; "
            f"measured on {source['measured_on']}, {source['date']}, `{source['command']}`)")
    return {"status": "read", "reading": text, "percent": percent, "at_epsilons": at, "setting": setting,
            "non_private_percent": None if plain is None else round(100 * plain["fraction"]), **source}


def meaning(verdict: str, epsilon: float, bound: float) -> str:
    """What the verdict does and does not mean at ``epsilon`` (``bound``: the informed adversary's ceiling)."""
    ceiling = (f"DP at ε = {epsilon:g} guarantees that even an informed adversary (one who knows every other training record) "
               f"reconstructs a given record with probability at most {bound:.3g} (Balle et al. 2022, from ε and δ alone)")
    if bound >= 1.0:
        ceiling += ": at this ε the guarantee rules out no reconstruction"
    if verdict == "leaks":
        return f"the attack reconstructed training images although the model was trained with DP at ε = {epsilon:g}; {ceiling}"
    if verdict == "no evidence":
        return (f"'no evidence' means this attack, within its budget, matched no more training images than images the model never "
                f"saw; it is one attack's failure, not a proof that nothing can be reconstructed: {ceiling}")
    return f"the verdict is inconclusive (an assumption of the attack failed), so it says nothing of the leak; {ceiling}"


def dp_record(epsilon: float, delta: float, start_known: bool, metrics: dict[str, Any], method: str | None = None) -> dict[str, Any]:
    """``metrics.json``'s ``dp`` of an audit: the stated (ε, δ), the measured reading, the bound at this audit's κ, the meaning."""
    from exhume.privacy import dp_bound, kappa_from_control

    matched, total = metrics.get("memorised_control") or 0, metrics.get("control_size") or 0
    kappa = kappa_from_control(int(matched), int(total)) if total else 1.0
    bound = dp_bound(epsilon, delta, kappa)
    return {"epsilon": epsilon, "delta": delta, "measured": measured_reading(epsilon, start_known, method=method), "kappa": round(kappa, 5),
            "kappa_definition": f"the control's match rate, {matched} of {total} never-seen images memorised (upper end of the "
                                "95 % Clopper–Pearson interval)",
            "bound": round(bound, 4), "bound_definition": "Balle, Cherubin and Hayes (2022): (ε, δ)-DP gives reconstruction "
                                                         "success at most e^ε·κ + δ against an informed adversary",
            "meaning": meaning(str(metrics.get("verdict")), epsilon, bound)}


def dp_line(dp: dict[str, Any]) -> str:
    """The audit summary's lines on differential privacy."""
    measured = dp.get("measured") or {}
    return (f"dp: trained with DP-SGD at ε = {dp['epsilon']:g}, δ = {dp['delta']:g}; {dp['meaning']}\n"
            f"dp, measured: {measured.get('reading', 'no measured reading')}")
