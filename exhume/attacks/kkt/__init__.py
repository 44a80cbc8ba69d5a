"""The stationarity (KKT) attack of Haim et al. (2022), with Buzaglo et al.'s weight-decay form.

Unknowns: ``m`` candidates ``x̂_j`` (centred input space) with fixed labels ``ŷ_j`` and multipliers
``λ_j = S · u_j``. Loss (docs/METHODS.md §1 and §5)::

    ‖θ − Σ_j λ_j ∇_θ h(Φ(θ; x̂_j), ŷ_j)‖² / ‖θ‖²               stationarity (relative)
    + dual_weight · Σ_j relu(λ_min − u_j)²                       dual feasibility, u ≥ λ_min
    + prior_weight · Σ relu(v − hi)² + relu(lo − v)²             pixels in the valid range
    + tv_weight · mean_j Σ (differences of neighbouring pixels of v_j)²   smoothness (images)

``h`` is the margin, the soft margin, ``−ℓ`` or ``Φ`` (:mod:`exhume.equations.formulation`); ``v = x̂ + mean ∈
[0, 1]`` (``prior="display"``) or ``v = x̂ ∈ [−1, 1]`` (``prior="centred"``, the reference's). Every ReLU keeps its
forward pass and uses ``sigmoid(α·z)`` as its derivative (:mod:`exhume.equations.surrogate`). With the starting weights
in the view, ``θ`` becomes what training added (§6, :mod:`exhume.equations.trajectory`); ``multipliers="closed-form"``
solves λ by least squares every step (:mod:`exhume.attacks.kkt.closed_form`).

The package, by responsibility: :mod:`~exhume.attacks.kkt.settings` (the parameter table, constants, presets, the
'auto' rules), :mod:`~exhume.attacks.kkt.problem` (the equation, the multipliers' scale, the span, the unknowns),
:mod:`~exhume.attacks.kkt.terms` (the loss), :mod:`~exhume.attacks.kkt.step` (the one step lone and batched runs
take) and :mod:`~exhume.attacks.kkt.attack` (the attack class). Each default beyond the papers is there for a
measured reason: docs/METHODS.md §5 and docs/defaults.md.
"""

from exhume.attacks.kkt.attack import KKTAttack
from exhume.attacks.kkt.problem import Problem
from exhume.attacks.kkt.settings import (
    LR_LAMBDA_MARGIN,
    LR_LAMBDA_SIGNED,
    PRESETS,
    TRACE_MIN_ITERATIONS,
    TRACE_MIN_SECONDS,
    equation_for,
    resolve_lr_lambda,
    traces,
)
from exhume.attacks.kkt.step import Step
from exhume.attacks.kkt.terms import terms

__all__ = ["LR_LAMBDA_MARGIN", "LR_LAMBDA_SIGNED", "PRESETS", "TRACE_MIN_ITERATIONS", "TRACE_MIN_SECONDS", "KKTAttack", "Problem",
           "Step", "equation_for", "resolve_lr_lambda", "terms", "traces"]
