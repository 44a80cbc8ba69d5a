"""Training-like data reconstruction (``tldr``), after TLDR (docs/METHODS.md §3): network inversion with more terms.

The generator of :mod:`~exhume.attacks.generative.inversion` with one-hot ("hot") conditioning, and added to its
terms ``α'·KL + β'·CE`` on an L∞-perturbed copy ``I + δ`` (``‖δ‖∞ = eps``, FGSM direction by default),
``η₁·TV + η₂·pixel range + η₃·‖∇_θ L(f_θ(I), y)‖`` (:mod:`exhume.attacks.generative.losses` for each term), ramped
up over ``warmup`` (why: :mod:`~exhume.attacks.generative.inversion`).
"""

from __future__ import annotations

from typing import Any

import torch

from exhume.attacks.engine.base import Param, register
from exhume.attacks.generative.inversion import COMMON_PARAMS, GeneratorAttack
from exhume.attacks.generative.losses import GRAD_MODES, PERTURBATIONS, ce_term, grad_norm_term, kl_term, perturb, pixel_term, tv_term

#: copies of the classifier's parameters per generated image with tldr's per-sample gradient norms (measured)
PER_SAMPLE_GRADIENT_MEMORY = 3.2


@register
class TLDRAttack(GeneratorAttack):
    """Training-like data reconstruction: inversion plus confidence, robustness, smoothness,
    pixel-range and small-parameter-gradient terms."""

    name = "tldr"
    hot = True
    ramped = ("kl_pert", "ce_pert", "tv", "pixel", "grad")
    params = {
        **COMMON_PARAMS,
        "alpha_pert": Param(1.0, float, "α': KL on the perturbed copy", low=0.0),
        "beta_pert": Param(1.0, float, "β': cross-entropy on the perturbed copy", low=0.0),
        "eps": Param(0.05, float, "L∞ size of the perturbation (display pixel units)", low=0.0, high=1.0),
        "perturbation": Param("fgsm", str, "perturbation direction", choices=PERTURBATIONS),
        "eta_tv": Param(0.05, float, "η₁: total variation (squared neighbour differences)", low=0.0),
        "eta_pix": Param(1.0, float, "η₂: pixel-range penalty Σ relu(−I) + relu(I − 1)", low=0.0),
        "eta_grad": Param(0.1, float, "η₃: ‖∇_θ L(f_θ(I), y)‖", low=0.0),
        "warmup": Param(0.2, float, "fraction of the steps over which the perturbed, TV, pixel and gradient terms ramp up from 0", low=0.0, high=1.0),
        "grad_mode": Param("batch", str, "batch: norm of the batch-mean gradient; per-sample: mean of per-sample norms (torch.func vmap)", choices=GRAD_MODES),
    }

    memory_knobs = {"batch_size": "count", "grad_mode": GRAD_MODES}
    # the perturbed copy and the gradient-norm term's double backward hold the classifier's activations again
    memory_coefficients = (50.0 * 2**20, 5.0, 5.0, 5.1, 1.6)

    def extra_memory(self, view) -> float:
        """Per-sample gradient norms hold a parameter-sized gradient per image (``grad_mode="per-sample"``)."""
        from exhume.attacks.engine import memory as mem

        if self.config["grad_mode"] != "per-sample" or not self.config["eta_grad"]:
            return 0.0
        return PER_SAMPLE_GRADIENT_MEMORY * self.config["batch_size"] * mem.parameter_count(view.model)

    def extra_weights(self) -> dict[str, float]:
        c = self.config
        return {"kl_pert": c["alpha_pert"], "ce_pert": c["beta_pert"], "tv": c["eta_tv"], "pixel": c["eta_pix"], "grad": c["eta_grad"]}

    def grad_note(self) -> str:
        return ("grad term: norm of the gradient of the batch-mean cross-entropy" if self.config["grad_mode"] == "batch"
                else "grad term: mean over the batch of per-sample gradient norms (torch.func vmap(grad))")

    def extra_terms(self, ctx: dict[str, Any]) -> dict[str, torch.Tensor]:
        c = self.config
        images, cond, classify = ctx["images"], ctx["cond"], ctx["classify"]
        terms: dict[str, torch.Tensor] = {}
        if c["alpha_pert"] or c["beta_pert"]:
            pert = perturb(images, cond.labels, classify, c["eps"], c["perturbation"], ctx["rng"])
            logits_p = classify(pert)
            terms["kl_pert"] = kl_term(cond.target, logits_p)
            terms["ce_pert"] = ce_term(cond.labels, logits_p)
        terms["tv"] = tv_term(images)
        terms["pixel"] = pixel_term(images)
        if c["eta_grad"]:
            terms["grad"] = grad_norm_term(ctx["model"], ctx["grad_params"], ctx["buffers"], images - ctx["mean"],
                                           cond.labels, c["grad_mode"])
        return terms
