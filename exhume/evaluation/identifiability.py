"""Does the attack's equation single out the training images? The residual at the truth beside the attack's best.

An attack that inverts an equation of the weights (:mod:`exhume.equations.kinds`) minimises a
relative residual over its candidates and reports its final value (``final_relative_stationarity``,
per restart for a portfolio). The evaluator, who holds the training images, asks the attack's
declared equation for the same quantity with the training images as the candidates
(:meth:`~exhume.evaluation.assumptions.Checks.fit_at_truth`: multipliers fitted by least squares, the
run's own formulation, signs, ``c`` and ``P``) and sets the two side by side:

- ``residual_at_training``: the equation's residual at the training images;
- ``attack_best_residual``: the lowest final residual of the attack's restarts;
- ``attack_to_truth``: their ratio. Below 1 the attack found images that satisfy the equation
  *better* than the training images do: the equation admits other solutions, so more descent on
  it moves away from the training images, and finding none of them proves nothing either way
  (``admits_other_images``). The verdict then cannot be *no evidence*
  (:mod:`exhume.evaluation.verdict`).

Evaluator-side (it reads the training set). Why it matters, and the measurements on the
practitioner zoo: docs/defaults.md#audit-identifiability.
"""

from __future__ import annotations

from typing import Any

import torch

from exhume.evaluation.assumptions import checks_for


def attack_best(recon) -> tuple[float | None, int]:
    """The lowest final relative residual the run reports (over its restarts) and how many restarts reported one."""
    return recon.record.best_residual if recon is not None else (None, 0)


def identifiability(equation, model, x: torch.Tensor, y: torch.Tensor, loss: str, measured: dict[str, Any], recon) -> dict[str, Any]:
    """The identifiability record of metrics.json (see the module docstring); ``x``: the training inputs as the model
    takes them, ``y``: exhume's labels, ``measured``: the equation's check residual on them."""
    best, restarts = attack_best(recon)
    record: dict[str, Any] = {"residual_at_training": None, "attack_best_residual": best, "attack_restarts": restarts,
                              "attack_to_truth": None, "admits_other_images": None,
                              "attack_candidates": int(recon.candidates.shape[0]), "n_train": int(len(x))}
    if best is None:
        record["note"] = "not measured: the attack reports no final residual of an equation of the weights"
        return record
    truth = checks_for(equation).fit_at_truth(model, x, y, loss, measured, recon)
    if truth is None or truth.get("value") is None:
        record["note"] = ("not measured: " + truth["definition"]) if truth else \
            "not measured: the attack's final residual is not a residual of the equation checked here"
        return record
    value = float(truth["value"])
    ratio = best / value if value > 0 else float("inf")
    record.update(residual_at_training=value, attack_to_truth=ratio, admits_other_images=bool(ratio < 1.0),
                  definition=truth["definition"] + "; attack_best_residual: the same with the attack's candidates and "
                  "multipliers, the lowest over its restarts")
    return record


def identifiability_failure(record: dict[str, Any] | None) -> list[str]:
    """The plain-words reason when the attack fits the equation better than the training images do (empty otherwise)."""
    if not record or not record.get("admits_other_images"):
        return []
    return [f"this threat model's equation admits other images that fit the weights better than the training images do "
            f"(the attack's best residual {record['attack_best_residual']:.3g} against {record['residual_at_training']:.3g} "
            f"at the training images, {record['attack_to_truth']:.2f}×), so finding none of them is expected and proves "
            "nothing either way"]


def identifiability_line(record: dict[str, Any] | None) -> str:
    """One line for the summary and the report's first screen ('' when not measured)."""
    if not record or record.get("attack_to_truth") is None:
        return ""
    word = ("admits other images: the attack fits better than the truth" if record["admits_other_images"]
            else "the training images fit at least as well as anything the attack found")
    return (f"residual at the training images {record['residual_at_training']:.3g}, attack's best "
            f"{record['attack_best_residual']:.3g} (ratio {record['attack_to_truth']:.2f}): {word}")
