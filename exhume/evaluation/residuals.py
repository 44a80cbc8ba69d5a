"""How far the real training data are from an attack's equation: the residuals only the evaluator can measure.

Each function here takes the training images (as the model takes them, centred) and exhume's labels, so it
lives with the evaluation, never with the attacks (``tests/test_protocol.py`` checks that no function of
``exhume/attacks/`` is handed the training images but the maths an attack also runs on its own candidates):

- :func:`relative_stationarity`: the stationarity equation's residual (with weight decay the relative gradient
  of the training objective; without, :func:`kkt_residual_nnls`, the best non-negative multipliers);
- :func:`stationarity_fit`: the kkt run's own final residual measure with the training images as its
  candidates (identifiability);
- :func:`known_start_residual` (through :func:`explained`): the known-start equation's residual;
- :func:`exact_run_residual`: the owner's recipe replayed on the training data.

Each returns ``{"value", "definition"}`` (value None: not measured, the definition says why); the limits and
the plain-words failures are the checks' (:mod:`exhume.evaluation.assumptions`).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad

from exhume.files.limits import LIMITS
from exhume.losses import margin, relative_objective_gradient


def relative_stationarity(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str, weight_decay: float) -> dict:
    """The relative stationarity residual of ``model`` on its training data ``(x, y)`` (model inputs)."""
    work = copy.deepcopy(model).double().eval()
    yy = y.double() if y.is_floating_point() else y
    if weight_decay > 0:
        value = relative_objective_gradient(work, x.double(), yy, loss, weight_decay)
        how = "‖∇ objective‖ / ‖weight_decay·θ‖ on the training data (0 = stationary)"
    else:
        value = kkt_residual_nnls(work, x, yy)
        how = "min over λ ≥ 0 of ‖θ − Σ λ_i ∇θ margin_i‖ / ‖θ‖ on the training data (no weight decay; 0 = KKT point)"
        if value is None:
            how += (f"; not measured: the Gram matrix of {x.shape[0]} training images' gradients would exceed "
                    f"LIMITS.gradient_matrix_bytes ({LIMITS.gradient_matrix_bytes} bytes)")
    return {"value": None if value is None else float(value), "definition": how}


def _flat_grads(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample ``∇_θ margin_i`` as the rows of an ``(n, p)`` matrix (a plain loop: any module).

    Written row by row, one parameter tensor's slice at a time (8× faster than columns or a
    ``torch.cat`` per row for a 1.8 M-parameter MLP).
    """
    def one(p, xi, yi):
        return margin(functional_call(model, p, (xi,)), yi).sum()

    out = torch.empty(x.shape[0], sum(v.numel() for v in params.values()), dtype=torch.float64)
    for i in range(x.shape[0]):
        g = grad(one)(params, x[i:i + 1], y[i:i + 1])
        at = 0
        for k in params:
            size = g[k].numel()
            out[i, at:at + size] = g[k].reshape(-1)
            at += size
    return out


def kkt_residual_nnls(model: nn.Module, x: torch.Tensor, y: torch.Tensor, memory: int | None = None) -> float | None:
    """``min_{λ ≥ 0} ‖θ − Σ_i λ_i ∇_θ margin_i‖ / ‖θ‖`` (the no-weight-decay KKT residual).

    The gradients ``G`` (``p × n`` float64) are held whole, with their QR factors, when that fits in
    ``memory`` bytes (default ``LIMITS.gradient_matrix_bytes``; three ``p × n`` matrices); otherwise only their Gram matrix
    ``GᵀG`` (``n × n``) and ``Gᵀθ`` are kept, accumulated from blocks of columns that fit (each
    block's partners recomputed), and the same least-squares problem is solved through the Gram
    matrix's eigendecomposition. A model of 1.8 M parameters trained on 1000 images would need 29 GB
    for ``G`` and its ``Q``; the Gram path holds 8 MB of Gram matrix and the blocks. None (not
    measured) when not even the Gram matrix and its eigenvectors fit in ``memory``.
    """
    from scipy.optimize import nnls

    memory = LIMITS.gradient_matrix_bytes if memory is None else int(memory)
    model = model.double().eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    theta = torch.cat([v.reshape(-1) for v in params.values()])
    x, y = x.double(), (y.double() if y.is_floating_point() else y)
    p, n = theta.numel(), x.shape[0]
    theta2 = float(theta @ theta)
    if 3 * 8 * p * n <= memory:  # G, the copy QR factorises and Q
        g = _flat_grads(model, params, x, y).T  # (p, n), column-major
        q, r = torch.linalg.qr(g, mode="reduced")  # ‖θ − Gλ‖² = ‖Qᵀθ − Rλ‖² + ‖θ‖² − ‖Qᵀθ‖²
        qt = q.T @ theta
        r_np, t_np = r.numpy(), qt.numpy()
    elif 3 * 8 * n * n > memory:
        return None
    else:
        gram, gt = _gram(model, params, theta, x, y, max(1, memory // (2 * 8 * p)))
        s, v = torch.linalg.eigh(gram)  # GᵀG = V S Vᵀ: R = S^½ Vᵀ and Qᵀθ = S^-½ Vᵀ Gᵀθ on S's range
        keep = s > s.max().clamp_min(0) * 1e-10
        root = s[keep].sqrt()
        r_np = (root[:, None] * v[:, keep].T).numpy()
        t_np = ((v[:, keep].T @ gt) / root).numpy()
    _, rnorm = nnls(r_np, t_np, maxiter=50 * r_np.shape[1])
    outside = max(theta2 - float((torch.from_numpy(t_np) ** 2).sum()), 0.0)
    return float((rnorm**2 + outside) ** 0.5 / max(theta2 ** 0.5, 1e-30))


def _gram(model: nn.Module, params: dict[str, torch.Tensor], theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
          block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``GᵀG`` and ``Gᵀθ`` of the per-sample margin gradients ``G``, holding two blocks of ``block`` of them at a time."""
    n = x.shape[0]
    gram = torch.zeros(n, n, dtype=torch.float64)
    gt = torch.zeros(n, dtype=torch.float64)
    starts = range(0, n, block)
    for a in starts:
        ga = _flat_grads(model, params, x[a:a + block], y[a:a + block])
        ea = a + ga.shape[0]
        gt[a:ea] = ga @ theta
        gram[a:ea, a:ea] = ga @ ga.T
        for b in starts:
            if b > a:
                gb = _flat_grads(model, params, x[b:b + block], y[b:b + block])
                eb = b + gb.shape[0]
                gram[a:ea, b:eb] = ga @ gb.T
                gram[b:eb, a:ea] = gram[a:ea, b:eb].T
                del gb
        del ga
    return gram, gt


def stationarity_fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str | None, form: str, denoise: str = "off",
                     n_guess: int | None = None, memory: int | None = None) -> dict[str, Any]:
    """``min_λ ‖t − Σ_i λ_i ∇_θ h(x_i, y_i)‖² / ‖t‖²`` at the training data: the kkt run's final residual measure
    (``h``: the run's formulation ``form``, λ ≥ 0 but for ``output``; ``t`` = θ or, where the run denoised, the
    learned part for its ``n_guess``), by least squares in float64 (as :func:`explained`).
    Value None when the ``n × p`` gradients (three copies) exceed ``memory`` (``LIMITS.gradient_matrix_bytes``)."""
    from exhume.equations.formulation import objective_for
    from exhume.equations.span import learned_part
    from exhume.equations.stationarity import gram_least_squares
    from exhume.equations.trajectory import StartEquation, per_sample
    from exhume.equations.workcopy import attack_model

    how = (f"min over λ {'signed' if form == 'output' else '≥ 0'} of ‖t − Σ_i λ_i ∇θ h(x_i)‖² / ‖t‖² at the training "
           f"images (h: the {form} formulation; t: θ")
    work, params = attack_model(model, "cpu", torch.float64)
    size = sum(v.numel() for v in params.values())
    memory = LIMITS.gradient_matrix_bytes if memory is None else int(memory)
    if 4 * size * len(x) > memory:  # the gradients are kept in float32
        return {"value": None, "definition": how + f"); not measured: {len(x)} images' gradients of {size} parameters "
                f"exceed LIMITS.gradient_matrix_bytes ({memory} bytes)"}
    target = None
    if denoise != "off":
        target, _ = learned_part(params, int(n_guess or len(x)))
        how += ", its part above the initialisation's noise, as the run used" if target is not None else ""
    target = params if target is None else target
    eq = StartEquation(tuple(params), [params], target, None, 1.0)
    objective = objective_for(form, loss, "classification" if form != "output" else "regression")  # the run validated it
    jac = torch.cat([per_sample(work, eq, x[s:s + 32].double(), y[s:s + 32], objective).float() for s in range(0, len(x), 32)])
    t = torch.cat([target[k].reshape(-1) for k in params]).double()
    gram, jt = torch.zeros(len(x), len(x), dtype=torch.float64), torch.zeros(len(x), dtype=torch.float64)
    for c in range(0, size, 1 << 16):  # J Jᵀ and J t in float64, a slice of columns at a time
        part = jac[:, c:c + (1 << 16)].double()
        gram += part @ part.T
        jt += part @ t[c:c + (1 << 16)]
    lam = gram_least_squares(gram, jt, nonnegative=form != "output")
    t2 = float(t @ t)
    rest = max(t2 - 2 * float(lam @ jt) + float(lam @ gram @ lam), 0.0)  # ‖t − Jᵀλ‖², J in float32
    return {"value": rest / t2, "definition": how + "; gradients in float32)"}


def explained(model: nn.Module, eq, x: torch.Tensor, y: torch.Tensor, objective, nonnegative: bool = False) -> dict[str, float]:
    """How well points ``x`` (labels ``y``, centred) explain what training added (``eq``: a
    :class:`~exhume.equations.trajectory.StartEquation`), by least squares in float64.

    Returns ``relative_residual`` ``min ‖target − Σ λ ∇h − c·direction‖² / ‖target − c·direction‖²``
    (λ signed; where ``c`` is free it is fitted, the denominator with the start alone) and the fitted ``c``. Memory: ``m·K × P`` float64
    numbers (500 points of a 784-256-256 MLP at two points: 2.2 GB). The training images explain what training
    added far better than unseen images do.
    """
    from exhume.equations.stationarity import least_squares
    from exhume.equations.trajectory import per_sample

    J = per_sample(model, eq, x, y, objective).double()
    t = torch.cat([eq.target[k].reshape(-1) for k in eq.names]).double()
    if eq.direction is not None:
        J = torch.cat([J, torch.cat([eq.direction[k].reshape(-1) for k in eq.names]).double()[None]])
    coef = least_squares(J, t, nonnegative, free=int(eq.direction is not None))  # λ ≥ 0 if asked; the start's c stays free
    rest = t - J.T @ coef
    return {"relative_residual": float(rest @ rest) / eq.norm2,
            "decay_fitted": float(coef[-1]) if eq.direction is not None else math.nan}


def known_start_residual(view, x: torch.Tensor, y: torch.Tensor, equation: str = "endpoints", decay: Any = "auto",
                         preconditioner: str = "auto", formulation: str = "auto", nonnegative: bool = True) -> dict[str, Any]:
    """How far the real training data are from the known-start equation (the assumption check).

    ``x``: the training inputs centred as the view's model takes them, ``y``: exhume's labels.
    Returns ``{"value", "definition", "decay"}``: :func:`explained`'s relative residual of what
    training added with the training points as the candidates (float64, λ ≥ 0 with a classifier's
    margin unless ``nonnegative=False``). To judge it, compare the same for as many unseen points.
    """
    from exhume.equations.formulation import form_for, resolve
    from exhume.equations.kinds import SolvedEquation
    from exhume.equations.trajectory import build_equation
    from exhume.equations.workcopy import attack_model

    model, params = attack_model(view.model, "cpu", torch.float64)
    eq = build_equation(view, model, params, equation, len(x), decay, preconditioner)
    form = resolve(view, model, formulation, 1.0, params, len(x), len(x), torch.float64)
    signed = form_for(view, formulation) == "output" or not nonnegative
    got = explained(model, eq, x.double().cpu(), y.cpu(), form.objective, nonnegative=not signed)
    points = "the final weights" if SolvedEquation(equation) is SolvedEquation.TRAJECTORY else "the start and the final weights"
    return {"value": got["relative_residual"], "decay": got["decay_fitted"] if eq.direction is not None else eq.info["start_decay"],
            "definition": f"min ‖P⊙(θ_T − c·θ_0) − Σ_i Σ_k λ_ik ∇_θ h(θ^(k); x_i)‖² / ‖P⊙(θ_T − c·θ_0)‖² over the trained "
                          f"parameters ({equation}: gradients at {points}; "
                          f"λ {'signed' if signed else '≥ 0'}; c {eq.info['start_decay_rule']}; P {eq.info['preconditioner']})"}


def exact_run_residual(view, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """The exact run replayed on the real training data ``(x, y)`` (centred inputs, exhume's labels), float64:
    ``{"value", "definition", "steps"}``, value :func:`~exhume.equations.exact.relative_gap` (0 up to rounding when
    the recipe is the one that ran)."""
    from exhume.equations.exact import hard_labels, make_replay, relative_gap, replay
    from exhume.equations.recipe import total_steps
    from exhume.equations.workcopy import attack_model

    model, params = attack_model(view.model, "cpu", torch.float64)
    r = make_replay(model, params, view.start, view.training, len(x), view.task)
    q = hard_labels(view.task, y.cpu(), view.num_classes, torch.float64)
    with torch.no_grad():
        theta = replay(r, x.double().cpu(), q, graph=False)
    value = float(relative_gap(r, theta, {k: params[k].detach() for k in r.names}))
    return {"value": value, "steps": total_steps(view.training, len(x)),
            "definition": "‖Run(θ_0; training data) − θ_T‖² / ‖θ_T − θ_0‖² over the trained parameters: the owner's recipe "
                          f"replayed exactly ({len(r.order)} steps, float64)"}
