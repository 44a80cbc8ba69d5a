"""The stationarity (KKT) attack of Haim et al. (2022), with Buzaglo et al.'s weight-decay form.

Unknowns: ``m`` candidates ``x̂_j`` (centred input space) with fixed labels ``ŷ_j`` and
multipliers ``λ_j = S · u_j``. Loss (docs/METHODS.md §1)::

    ‖θ − Σ_j λ_j ∇_θ h(Φ(θ; x̂_j), ŷ_j)‖² / ‖θ‖²               stationarity (relative)
    + dual_weight · Σ_j relu(λ_min − u_j)²                       dual feasibility, u ≥ λ_min
    + prior_weight · Σ relu(v − hi)² + relu(lo − v)²             pixels in the valid range
    + tv_weight · mean_j Σ (differences of neighbouring pixels of v_j)²   smoothness (images)

``h`` is the margin (binary ``y·Φ``, multiclass ``Φ_y − max_{k≠y} Φ_k``), ``−ℓ`` (the
weight-decay form for any loss) or ``Φ`` (regression, signed λ, no dual term): see
:mod:`exhume.attacks.formulation`. Binary candidates are half +1 / half −1, multiclass ones
spread evenly over the classes.

with ``v = x̂ + mean ∈ [0, 1]`` (prior="display", the default) or ``v = x̂ ∈ [−1, 1]``
(prior="centred", the reference's). The total-variation term is off by default (MLP victims do
not need it); it helps on convolutional victims: 3×3 filters followed by pooling barely see
high-frequency patterns, so without it the candidates fit the equation while staying covered in
pixel noise. During the attack every ReLU keeps its forward pass and uses
``sigmoid(α·z)`` as its derivative (:mod:`exhume.attacks.surrogate`).

**The multiplier scale S** (details in :mod:`exhume.attacks.formulation`). Without weight decay (Haim's max-margin setting) ``S = 1``, as in the
reference. A victim trained with weight decay ``w`` on ``mean_i ℓ_i + (w/2)‖θ‖²`` satisfies the
same equation with ``λ_i = −ℓ'_i / (n·w)`` (Buzaglo et al.): for the logistic loss
``λ_i = σ(−margin_i)/(n·w)``, which is far below 1 when the training points are fitted. Since a
homogeneous network trades the scale of ``λ`` against the scale of ``x̂``, a λ scale that is too
large shrinks every candidate towards the data mean. ``lambda_scale="auto"`` estimates a typical
``λ`` from the weights alone: for a network of homogeneity degree ``L`` (Euler:
``⟨θ, ∇_θΦ(x)⟩ = L·Φ(x)``) stationarity gives ``Σ_i λ_i margin_i = ‖θ‖²/L``, so with equal margins
``m*`` solving ``σ(−m*)·m* = w‖θ‖²/L`` the typical multiplier is ``σ(−m*)/(n·w)``, and
``S = (5/3) × that`` (``AUTO_SCALE_FACTOR``). ``n`` is the attacker's guess of the training-set
size (``m/2`` by default).

**Optimiser.** The reference uses SGD with momentum 0.9 (``optimizer="sgd"``, available); Adam is
the default here (SGD diverges readily because the loss's curvature in ``x̂`` grows with ``λ²``).

The measurements behind these defaults (TV weight, the auto-scale factor, Adam against SGD) are
in ``benchmarks/README.md``, "Measurements behind the kkt defaults".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from exhume.attacks.base import DTYPES, Attack, Param, Reconstruction, attack_model, init_record, initial_candidates, register
from exhume.attacks.checkpoint import load_checkpoint, resumable_settings, save_checkpoint
from exhume.attacks.formulation import FORMULATIONS, resolve
from exhume.attacks.inversion_losses import tv_term
from exhume.attacks.loop import run_loop
from exhume.attacks.stationarity import stationarity_residual
from exhume.errors import ConfigError, DivergenceError
from exhume.losses import LOSSES


@register
class KKTAttack(Attack):
    """Stationarity (KKT) reconstruction from the weights alone: binary, multiclass, regression."""

    name = "kkt"
    params = {
        "m": Param(None, int, "number of candidates (default 2n, n the training-set size guess)", low=1, allow_none=True),
        "n_guess": Param(None, int, "attacker's guess of n (default from the victim's metadata, else 100)", low=1, allow_none=True),
        "iterations": Param(20_000, int, "optimisation steps", low=1),
        "max_seconds": Param(None, float, "stop after this much wall time (resumable)", low=0.0, allow_none=True),
        "init_scale": Param(1.7e-3, float, "x̂ ~ N(0,1)·init_scale in centred space", low=0.0),
        "lr": Param(1e-2, float, "learning rate for x̂ (on the relative stationarity loss)", low=0.0),
        "lr_lambda": Param(1e-2, float, "learning rate for u (λ = S·u)", low=0.0),
        "optimizer": Param("adam", str, "optimiser for x̂ and u", choices=("sgd", "adam")),
        "momentum": Param(0.9, float, "SGD momentum for both optimisers (sgd only)", low=0.0, high=1.0),
        "lambda_min": Param(0.42, float, "dual-feasibility floor on u = λ/S", low=0.0),
        "lambda_scale": Param("auto", object, "S in λ = S·u: 'auto' or a positive number"),
        "formulation": Param("auto", str, "stationarity equation (see exhume/attacks/formulation.py)", choices=FORMULATIONS),
        "loss": Param(None, str, "the victim's training loss, if its metadata lacks it", choices=LOSSES, allow_none=True),
        "weight_decay": Param(None, float, "the victim's weight decay, if its metadata lacks it", low=0.0, allow_none=True),
        "alpha": Param(19.0, float, "ReLU surrogate derivative sigmoid(α·z)", low=0.0),
        "prior": Param("display", str, "pixel-range prior space", choices=("display", "centred")),
        "prior_weight": Param(1.0, float, "weight of the pixel-range prior", low=0.0),
        "tv_weight": Param(0.0, float, "weight of the total-variation (smoothness) prior on image candidates; "
                           "0 = off (MLPs), about 1e-4 for CNNs", low=0.0),
        "dual_weight": Param(5.0, float, "weight of the λ ≥ λ_min penalty", low=0.0),
        "dtype": Param("float32", str, "computation precision", choices=tuple(DTYPES)),
        "checkpoint_every": Param(1000, int, "iterations between checkpoints (with an output folder)", low=1),
        "log_every": Param(100, int, "iterations between loss-history entries", low=1),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        s = self.config["lambda_scale"]
        if not (s == "auto" or (isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 and math.isfinite(s))):
            raise ConfigError(f"lambda_scale must be 'auto' or a positive number, got {s!r}")

    def check(self, view) -> None:
        if self.config["tv_weight"] > 0 and len(view.input_shape) != 3:
            raise ConfigError(f"tv_weight needs image inputs (C, H, W); this victim's input shape is {tuple(view.input_shape)}")

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", resume: bool = False,
            progress: bool = True, callback=None, callback_every: int = 1000, init: torch.Tensor | None = None,
            init_name: str = "noise", callback_multipliers: bool = False) -> Reconstruction:
        """Run the attack on ``view`` (an :class:`~exhume.victim.AttackerView`).

        ``out``: folder for checkpoints (every ``checkpoint_every`` iterations and at the end);
        ``resume``: continue from its checkpoint. ``callback(iteration, seconds, candidates)`` is
        called every ``callback_every`` iterations with the display-space candidates (for
        quality-over-time curves; its time is not counted in ``seconds``). ``init``: starting
        candidates in display space (default: noise); ``init_name`` labels them in the result
        (ground-truth, partition and mix initialisations are oracle tools and marked so).
        ``callback_multipliers=True`` also passes the current multipliers ``λ = S·u`` as the keyword
        ``multipliers`` (for attacker-side scoring during a hyperparameter search).
        """
        self.check(view)
        cfg = self.config
        dtype = DTYPES[cfg["dtype"]]
        dev = torch.device(device)
        model, params = attack_model(view.model, dev, dtype)  # the user's module stays as it is
        theta2 = sum((p**2).sum() for p in params.values())
        n = cfg["n_guess"] or view.n_train_hint or 100
        m = cfg["m"] or (init.shape[0] if init is not None else 2 * n)
        form = resolve(view, model, cfg["formulation"], cfg["loss"], cfg["weight_decay"], cfg["lambda_scale"], params, n, m, dtype)
        scale, objective = form.scale, form.objective
        mean = view.mean.to(dev, dtype)
        y = form.labels.to(dev)

        gen = torch.Generator().manual_seed(seed)
        x = initial_candidates(init, m, view.input_shape, view.mean, cfg["init_scale"], gen, dtype).to(dev).requires_grad_()
        u = (torch.randn if form.signed else torch.rand)(m, generator=gen, dtype=dtype).to(dev).requires_grad_()
        if cfg["optimizer"] == "sgd":
            opt_x: torch.optim.Optimizer = torch.optim.SGD([x], lr=cfg["lr"], momentum=cfg["momentum"])
            opt_u: torch.optim.Optimizer = torch.optim.SGD([u], lr=cfg["lr_lambda"], momentum=cfg["momentum"])
        else:
            opt_x, opt_u = torch.optim.Adam([x], lr=cfg["lr"]), torch.optim.Adam([u], lr=cfg["lr_lambda"])
        use_tv = cfg["tv_weight"] > 0
        lo, hi, shift = (0.0, 1.0, mean) if cfg["prior"] == "display" else (-1.0, 1.0, torch.zeros_like(mean))

        state = {"iteration": 0, "elapsed": 0.0, "history": []}
        ckpt_path = Path(out) / "checkpoint.pt" if out is not None else None
        if resume and ckpt_path is not None and ckpt_path.exists():
            state = load_checkpoint(ckpt_path, {"x": x, "u": u}, {"opt_x": opt_x, "opt_u": opt_u},
                                    expect={"config": resumable_settings(cfg), "seed": seed, "m": m})

        start_iter, elapsed0 = state["iteration"], state["elapsed"]
        history: list[dict[str, float]] = state["history"]

        def save(done: int, elapsed: float) -> None:
            if ckpt_path is not None:
                save_checkpoint(ckpt_path, {"x": x, "u": u}, {"opt_x": opt_x, "opt_u": opt_u},
                                {"iteration": done, "elapsed": elapsed, "history": history,
                                 "config": resumable_settings(cfg), "seed": seed, "m": m})

        def step(it: int, log: bool, clock) -> dict[str, str] | None:
            stat = stationarity_residual(model, params, x, y, scale * u, cfg["alpha"], objective) / theta2
            dual = u.new_zeros(()) if form.signed else (torch.relu(cfg["lambda_min"] - u) ** 2).sum()
            v = x + shift
            prior = (torch.relu(v - hi) ** 2 + torch.relu(lo - v) ** 2).sum()
            loss = stat + cfg["dual_weight"] * dual + cfg["prior_weight"] * prior
            if use_tv:
                loss = loss + cfg["tv_weight"] * tv_term(v)
            if not torch.isfinite(loss):
                raise DivergenceError(f"kkt attack diverged at iteration {it} (loss {float(loss.detach())}); lower lr (now {cfg['lr']})")
            opt_x.zero_grad(set_to_none=True)
            opt_u.zero_grad(set_to_none=True)
            loss.backward()
            opt_x.step()
            opt_u.step()
            if not log:
                return None
            rec = {"iteration": it, "loss": float(loss.detach()), "stationarity": float(stat.detach()),
                   "dual": float(dual.detach()), "prior": float(prior.detach()), "seconds": round(clock(), 3)}
            history.append(rec)
            return {"stat": f"{rec['stationarity']:.3g}"}

        def emit(it: int, elapsed: float) -> None:
            with torch.no_grad():
                if callback_multipliers:
                    callback(it, elapsed, (x + mean).float().cpu(), multipliers=(scale * u).float().cpu())
                else:
                    callback(it, elapsed, (x + mean).float().cpu())

        end = run_loop("kkt attack", cfg["iterations"], cfg["max_seconds"], start_iter, elapsed0, step, save,
                       log_every=cfg["log_every"], checkpoint_every=cfg["checkpoint_every"], progress=progress,
                       emit=None if callback is None else emit, emit_every=callback_every)
        with torch.no_grad():
            final_stat = float(stationarity_residual(model, params, x, y, scale * u, None, objective) / theta2)
            candidates = (x + mean).float().cpu()
        return Reconstruction(
            method=self.name,
            candidates=candidates,
            labels=y.cpu(),
            scores=(scale * u).detach().float().cpu(),
            config={**cfg, "m": m, "n_guess": n, "lambda_scale_value": scale, **form.info, **init_record(init_name)},
            seed=seed,
            loss_history=history,
            summary={"iterations": end.done, "seconds": round(end.elapsed, 3), "final_relative_stationarity": final_stat,
                     "final_relative_stationarity_note": "with the exact ReLU derivative"},
        )
