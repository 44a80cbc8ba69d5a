"""The candidate game (Hayes, Mahloujifar and Balle 2023) from the weights: k candidates, one trained on; name it.

Each candidate is scored by the share of what the known records leave of kkt's equation that its own gradient
explains (:func:`exhume.equations.remainder.explained`), the best named; chance 1/k. Where every record but one is
known and the first layer off their span is rank one (where the first layer's read applies), by how well its own part
off that span lines up with it instead (:func:`exhume.attacks.kkt.read.aligned`): that part is the target's alone, the
whole equation's remainder also holds the victim's distance from a stationary point. One pass, no optimisation.
:func:`rank` is kkt's ranking of its own candidates with known records. docs/METHODS.md §7.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from exhume.attacks.engine.base import Attack, Param, Reconstruction, attack_model, register
from exhume.attacks.engine.record import RunRecord
from exhume.attacks.kkt.read import aligned
from exhume.attacks.kkt.settings import equation_for
from exhume.deadline import NEVER, Deadline
from exhume.equations.formulation import resolve
from exhume.equations.kinds import Equation, KnownStart, SolvedEquation, Stationarity
from exhume.equations.remainder import Remainder, columns, explained, remainder_of
from exhume.equations.span import learned_part
from exhume.equations.stationarity import negative_loss_objective
from exhume.equations.trajectory import build_equation
from exhume.errors import ConfigError

#: candidates scored at once
CHUNK = 64

PARAMS: dict[str, Param] = {
    "start_equation": Param("auto", str, "with a known start: 'endpoints' or 'trajectory' (kkt's); 'stationary' ignores it",
                            choices=("auto", "stationary", "trajectory", "endpoints")),
    "multipliers": Param("auto", str, "'auto': 1/(n·w) for h = −ℓ where the loss, weight decay and n are known and the "
                         "equation is stationary, else free; 'free': fitted per candidate (DP-SGD's clipping changes each "
                         "record's multiplier: the DP audit's choice)", choices=("auto", "free")),
    "iterations": Param(1, int, "the game takes one pass (no optimisation); the budget's iterations are ignored", low=1),
}


@register
class CandidateGame(Attack):
    """Name the trained-on record among k candidates, from the weights and the records the attacker knows."""

    name = "game"
    params = PARAMS
    equation = Stationarity()
    uses_start = True
    uses_records = ("known", "candidates")
    takes_init = False

    def check(self, view) -> None:
        if getattr(view, "candidates", None) is None or len(view.candidates) < 2:
            raise ConfigError("the candidate game needs two or more candidates (candidates=FILE.npz or (x, y); "
                              "--candidates FILE), one of which was trained on")

    def equation_on(self, view) -> Equation:
        used = equation_for(self.config["start_equation"], view)
        return self.equation if used == "stationary" else KnownStart(view=view, kind=used, nonnegative=False,
                                                                     attack_residual=False)

    def candidate_count(self, n: int) -> int | None:
        return None

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", progress: bool = True,
            deadline: Deadline = NEVER, checkpoint_every: int | None = None, log_every: int | None = None,
            **_: Any) -> Reconstruction:
        """Score every candidate: one pass, so no deadline, checkpoint or log cadence binds it."""
        self.check(view)
        t0 = time.perf_counter()
        cand = view.candidates
        scores, info = self.scores(view, cand.x, cand.y, device)
        order = torch.argsort(-scores, stable=True)
        used = info["equation_used"]
        threat = {"threat_model": view.threat_model,
                  "equation": SolvedEquation.STATIONARY if used == "stationary" else SolvedEquation(used)}
        settings = {**self.config, **info, "named": int(order[0]), "order": order.tolist(), "candidates": len(cand)}
        return Reconstruction(method=self.name, candidates=cand.x[order].float(), labels=cand.y[order], scores=scores[order].float(),
                              record=RunRecord(iterations=1, seconds=round(time.perf_counter() - t0, 3), settings=settings,
                                               extras={"scores": scores.tolist()}, **threat), seed=seed)

    def _equation(self, view, model, params, used: str, n: int):
        """``(objective, the multiplier given or None, the known-start equation or None, the equation's left side)``."""
        form = resolve(view, model, "auto", "auto", params, n, 2, torch.float64)
        if used != "stationary":
            eq = build_equation(view, model, params, used, n)
            return form.objective, None, eq, eq.target
        learned, _ = learned_part(params, n)
        target = {k: (learned or {}).get(k, v) for k, v in params.items()}
        wd = float(view.weight_decay or 0.0)
        if self.config["multipliers"] == "auto" and view.loss is not None and wd > 0 and view.task != "regression":
            return negative_loss_objective(view.loss), 1.0 / (n * wd), None, target
        return form.objective, None, None, target

    def scores(self, view, cand_x: torch.Tensor, cand_y: torch.Tensor, device: str = "cpu",
               alignment: bool = True) -> tuple[torch.Tensor, dict[str, Any]]:
        """Each candidate's score (its alignment off the known records' span where the read applies and ``alignment``,
        else its share of what ``view.known`` leave of the equation that it explains), and how it was scored."""
        known = view.known
        n = view.n_train_hint or (len(known) + 1 if known is not None else None)
        if n is None:
            raise ConfigError("the candidate game needs the training set's size: give known_records, or a view with "
                              "n_train_hint")
        used = equation_for(self.config["start_equation"], view)
        info = {"equation_used": used, "n_assumed": int(n), "known_records": 0 if known is None else len(known)}
        lined = aligned(view, int(n), cand_x) if alignment else None
        if lined is not None:
            return lined.cpu(), {**info, "scored_by": "alignment off the known records' span (the first layer's read)"}
        model, params = attack_model(view.model, torch.device(device), torch.float64)
        mean = view.mean.to(device=device, dtype=torch.float64)
        objective, given, eq, target = self._equation(view, model, params, used, int(n))
        rem = self._remainder(model, params, known, mean, objective, eq, target)
        x, y, left = cand_x.to(mean) - mean, _labels(cand_y, mean), rem.flat(target)
        shares = []
        for i in range(0, len(x), CHUNK):  # the candidates' columns a chunk at a time: a portfolio's pool may hold thousands
            cols = columns(model, params, x[i:i + CHUNK], y[i:i + CHUNK], objective, eq)
            lam = None if given is None else torch.full((cols.shape[0],), given, dtype=torch.float64, device=mean.device)
            shares.append(explained(rem, left, cols, signed=eq is not None, given=lam).cpu())
        shares = torch.cat(shares)
        return shares, {**info, "scored_by": "explained share of the equation's remainder",
                        "multipliers_used": "free" if given is None else f"1/(n·w) = {given:.6g} for h = −ℓ"}

    @staticmethod
    def _remainder(model, params, known, mean, objective, eq, target) -> Remainder:
        if known is not None:
            return remainder_of(model, params, known.x.to(mean) - mean, _labels(known.y, mean), objective, eq)
        names = tuple(eq.names) if eq is not None else tuple(params)
        empty = torch.zeros(sum(target[k].numel() for k in names), 0, dtype=torch.float64, device=mean.device)
        if eq is not None and eq.direction is not None:
            d = torch.cat([eq.direction[k].reshape(-1) for k in names])
            empty = (d / d.norm())[:, None]
        return Remainder(names, empty, 0)


def _labels(y: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Labels on ``like``'s device, in its dtype where they are numbers (binary ±1, regression), class ids as they are."""
    return y.to(like) if y.is_floating_point() else y.to(like.device)


def rank(view, cand_x: torch.Tensor, cand_y: torch.Tensor, start_equation: str = "auto") -> tuple[torch.Tensor, torch.Tensor, dict]:
    """``(order, shares, info)``: candidates ranked by the share of what ``view.known`` leave of the equation that each
    explains, multipliers free (what kkt's informed ranking uses: its candidates are approximations, whose columns a
    fixed multiplier would over-count)."""
    game = CandidateGame(start_equation=start_equation, multipliers="free")
    shares, info = game.scores(view, cand_x, cand_y, str(cand_x.device), alignment=False)
    return torch.argsort(-shares, stable=True), shares, {f"informed_{k}": v for k, v in info.items()}
