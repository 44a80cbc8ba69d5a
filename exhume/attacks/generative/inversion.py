"""Network inversion (``inversion``), and what it shares with TLDR (:mod:`~exhume.attacks.generative.tldr`): docs/METHODS.md §3.

Both train a :class:`~exhume.attacks.generative.generator.ConditionedGenerator` against the frozen
classifier (in ``.eval()`` mode: batch norm on its running statistics, dropout off) and return
``samples_per_class`` generated images per class in display space, labelled with the class they
were conditioned on, scored by the classifier's probability of that class (:class:`GeneratorAttack`).

``inversion`` minimises ``α·KL(P ‖ softmax f(I)) + β·CE + γ·cosine + δ·ortho`` with soft
(softmaxed normal) conditioning vectors (:mod:`exhume.attacks.generative.losses` for each term). The
features for the cosine and orthogonality terms are the classifier's last hidden layer: the input of
its last ``nn.Linear`` (found generically), or the output of the module named by ``feature_layer``.

``output="sigmoid"`` keeps images in [0, 1] (the pixel-range term then acts only with ``output="linear"``), and tldr's
added terms ramp up over ``warmup``: without both, those terms swamp the cross-entropy at initialisation
(docs/defaults.md#tldr-generator-and-output).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torch.func import functional_call

from exhume.attacks.engine.base import Attack, Param, Reconstruction, attack_model, register
from exhume.attacks.engine.checkpoint import resumable_settings
from exhume.attacks.engine.loop import RunState, attack_loop, budget_params, make_optimizer, open_run
from exhume.attacks.engine.record import RunRecord
from exhume.attacks.generative.generator import CONDITIONINGS, OUTPUTS, ConditionedGenerator
from exhume.attacks.generative.losses import ce_term, cosine_term, kl_term, ortho_term
from exhume.deadline import NEVER, Deadline
from exhume.equations.kinds import Equation
from exhume.errors import ConfigError, DivergenceError


class FeatureTap:
    """Records the classifier's last-hidden-layer features on every forward pass."""

    def __init__(self, model: nn.Module, layer: str | None = None) -> None:
        self.value: torch.Tensor | None = None
        self.active = True
        modules = dict(model.named_modules())
        if layer is None:
            linears = [(n, m) for n, m in modules.items() if isinstance(m, nn.Linear)]
            if not linears:
                raise ConfigError("the classifier has no nn.Linear layer to read features from; name one with feature_layer")
            self.layer = linears[-1][0]
            self.handle = linears[-1][1].register_forward_pre_hook(self._pre)
            self.where = f"input of {self.layer!r} (the last nn.Linear)"
        else:
            if layer not in modules or layer == "":
                known = [n for n in modules if n][:20]
                raise ConfigError(f"feature_layer {layer!r} is not a module of the classifier; some known: {', '.join(known)}")
            self.layer = layer
            self.handle = modules[layer].register_forward_hook(self._post)
            self.where = f"output of {layer!r}"

    def _pre(self, module, args) -> None:
        if self.active:
            self.value = args[0]

    def _post(self, module, args, output) -> None:
        if self.active:
            self.value = output

    def remove(self) -> None:
        self.handle.remove()


INVERSION_BUDGET = ("steps", "samples_per_class")


COMMON_PARAMS: dict[str, Param] = {
    "conditioning": Param("vector-matrix", str, "generator conditioning", choices=CONDITIONINGS),
    **budget_params(300, name="steps", unit="generator training steps"),
    "batch_size": Param(64, int, "generated images per step", low=2),
    "lr": Param(3e-3, float, "Adam learning rate of the generator", low=0.0),
    "latent_dim": Param(64, int, "latent vector size", low=1),
    "width": Param(32, int, "generator channels", low=1),
    "dropout": Param(0.3, float, "generator dropout (the paper's heavy dropout, for diversity)", low=0.0, high=0.95),
    "output": Param("sigmoid", str, "generator output activation", choices=OUTPUTS),
    "alpha": Param(1.0, float, "α: KL(conditioning ‖ classifier softmax)", low=0.0),
    "beta": Param(1.0, float, "β: cross-entropy with the hidden label", low=0.0),
    "gamma": Param(1.0, float, "γ: mean pairwise cosine similarity of features", low=0.0),
    "delta": Param(1.0, float, "δ: ‖Gram(features) − I‖²/N²", low=0.0),
    "ortho_normalize": Param(True, bool, "L2-normalise features before the Gram matrix"),
    "feature_layer": Param(None, str, "module whose output are the features (default: input of the last nn.Linear)", allow_none=True),
    "samples_per_class": Param(10, int, "candidates returned per class", low=1),
    "sample_mode": Param("train", str, "generator mode when drawing candidates (train: dropout and batch statistics as during training)",
                         choices=("train", "eval")),
}


@dataclass
class GeneratorProblem:
    """The frozen classifier (a working copy), its feature tap, and the generator being trained."""

    model: nn.Module
    classify: Callable[[torch.Tensor], torch.Tensor]  # display-space images -> logits
    buffers: dict[str, torch.Tensor]
    grad_params: dict[str, torch.Tensor]  # detached weights that require grad (tldr's gradient term)
    tap: FeatureTap
    mean: torch.Tensor
    k: int
    gen: ConditionedGenerator
    rng: torch.Generator


class GeneratorAttack(Attack):
    """Shared machinery: generator training loop, checkpoints, candidate drawing."""

    takes_init = False  # candidates come from the generator, not from starting images
    equation = Equation()  # it inverts the classifier's decisions, not an equation of the weights and the training data
    budget = "steps"
    checkpoint_every, log_every = 500, 50

    hot: bool = False
    memory_knobs = {"batch_size": "count"}
    #: bytes beyond every attack's, then copies of the classifier's parameters, of the generator's, and of an image's
    #: classifier and generator activations at the peak (measured, ``benchmarks/memory_estimate.py``)
    memory_coefficients: tuple[float, float, float, float, float] = (0.0, 3.0, 5.0, 1.6, 1.6)

    def peak_memory_bytes(self, view) -> int:
        """Peak bytes (float32): the classifier's copy, the generator with its gradients and Adam's two moments, and per
        generated image the classifier's and the generator's activations (:attr:`memory_coefficients`)."""
        from exhume.attacks.engine import memory as mem

        cfg = self.config
        with torch.random.fork_rng(devices=[]), torch.device("meta"):  # shapes only: nothing allocated, the seed untouched
            gen = ConditionedGenerator(tuple(view.input_shape), int(view.num_classes or 2), cfg["conditioning"], cfg["latent_dim"],
                                       cfg["width"], cfg["dropout"], cfg["output"])
            g, ga = mem.parameter_count(gen), mem.counted(gen, gen.sample)
        a = mem.activation_elements(view.model, tuple(view.input_shape))
        extra, per_p, per_g, per_a, per_ga = self.memory_coefficients
        batch = cfg["batch_size"]
        images = batch * (per_a * a.per_input + per_ga * ga.per_input) + per_a * a.fixed + per_ga * ga.fixed
        elements = per_p * mem.parameter_count(view.model) + per_g * g + images + self.extra_memory(view)
        return int(mem.BASE_BYTES + extra + 4 * elements)

    def extra_memory(self, view) -> float:
        """Elements the attack's own terms add at the peak (none here)."""
        return 0.0

    def extra_terms(self, ctx: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {}

    def check(self, view) -> None:
        if view.task != "multiclass" or not view.num_classes:
            raise ConfigError(f"the {self.name} attack needs a multiclass classifier; the victim's task is {view.task!r}")
        if len(view.input_shape) != 3:
            raise ConfigError(f"the {self.name} attack needs image inputs (C, H, W); the victim's input shape is {view.input_shape}")

    def run(self, view, out: str | Path | None = None, seed: int = 0, device: str = "cpu", resume: bool = False,
            progress: bool = True, callback=None, callback_every: int = 500, deadline: Deadline = NEVER,
            checkpoint_every: int | None = None, log_every: int | None = None, owner=None) -> Reconstruction:
        """Train the generator against ``view``'s classifier and draw candidates.

        ``out``: folder for checkpoints (and ``generator.safetensors`` at the end); ``resume``:
        continue from its checkpoint. ``callback(step, seconds, candidates)`` is called every
        ``callback_every`` steps with freshly drawn display-space candidates; ``deadline``, ``checkpoint_every`` and
        ``log_every`` and ``owner`` as :meth:`exhume.attacks.kkt.KKTAttack.run`'s.
        """
        self.check(view)
        cfg, every = self.config, self.cadence(checkpoint_every, log_every)
        c = self.problem(view, torch.device(device), seed)
        opt = make_optimizer("adam", c.gen.parameters(), cfg["lr"], betas=(0.5, 0.999))
        rngs = {"rng": c.rng.get_state(), "torch_rng": torch.get_rng_state()}
        tensors = dict(c.gen.state_dict())
        run = open_run(out, resume, {**tensors, **rngs}, {"opt": opt},
                       {"config": resumable_settings(cfg, INVERSION_BUDGET), "seed": seed, "method": self.name},
                       snapshot=lambda: {**tensors, "rng": c.rng.get_state(), "torch_rng": torch.get_rng_state()},
                       defaults=self.defaults(), owner=owner)
        c.rng.set_state(rngs["rng"])  # restored in place by a resume, else unchanged
        torch.set_rng_state(rngs["torch_rng"])
        step = self.stepper(c, opt, run.history)

        def emit(it: int, elapsed: float) -> None:
            callback(it, elapsed, self._draw(c.gen, c.classify, c.k, c.rng)[0])

        try:
            end = attack_loop(f"{self.name} attack", cfg["steps"], run, step, deadline, every, progress=progress,
                              emit=None if callback is None else emit, emit_every=callback_every)
        finally:
            c.tap.remove()
        return self.result(c, end, run, seed, out)

    def problem(self, view, dev: torch.device, seed: int) -> GeneratorProblem:
        """The classifier's working copy (frozen, eval mode), its feature tap and the seeded generator."""
        cfg = self.config
        model, params = attack_model(view.model, dev, torch.float32)
        mean = view.mean.to(dev).float()
        buffers = {n: b.detach() for n, b in model.named_buffers()}

        def classify(images: torch.Tensor) -> torch.Tensor:
            return functional_call(model, (params, buffers), (images - mean,))

        k = int(view.num_classes)
        torch.manual_seed(seed)
        gen = ConditionedGenerator(tuple(view.input_shape), k, cfg["conditioning"], cfg["latent_dim"], cfg["width"],
                                   cfg["dropout"], cfg["output"]).to(dev)
        return GeneratorProblem(model, classify, buffers, {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()},
                                FeatureTap(model, cfg["feature_layer"]), mean, k, gen, torch.Generator().manual_seed(seed))

    def stepper(self, c: GeneratorProblem, opt: torch.optim.Optimizer, history: list[dict[str, Any]]):
        """One generator step on the weighted terms (appends to ``history`` when logging)."""
        cfg = self.config
        weights = {"kl": cfg["alpha"], "ce": cfg["beta"], "cosine": cfg["gamma"], "ortho": cfg["delta"], **self.extra_weights()}

        def step(it: int, log: bool, clock) -> dict[str, str] | None:
            c.gen.train()
            images, cond = c.gen.sample(cfg["batch_size"], c.rng, hot=self.hot)
            logits, terms = self.terms(c, images, cond)
            ramp = self.ramp(it)
            loss = sum(weights[n] * (ramp if n in self.ramped else 1.0) * v for n, v in terms.items() if weights[n] != 0)
            if not torch.isfinite(loss):
                raise DivergenceError(f"{self.name} attack diverged at step {it}; lower lr (now {cfg['lr']})")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if not log:
                return None
            with torch.no_grad():
                acc = float((logits.argmax(1) == cond.labels).float().mean())
            rec = {"iteration": it, "loss": float(loss.detach()), "accuracy": acc, "seconds": round(clock(), 3),
                   **{n: float(v.detach()) for n, v in terms.items()}}
            history.append(rec)
            return {"loss": f"{rec['loss']:.3g}", "acc": f"{acc:.2f}"}

        return step

    def terms(self, c: GeneratorProblem, images: torch.Tensor, cond) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The classifier's logits on ``images`` and every loss term (unweighted)."""
        c.tap.value = None
        logits = c.classify(images)
        feats = c.tap.value
        if feats is None:
            raise ConfigError(f"feature layer {c.tap.layer!r} was not used in the classifier's forward pass")
        terms = {"kl": kl_term(cond.target, logits), "ce": ce_term(cond.labels, logits),
                 "cosine": cosine_term(feats), "ortho": ortho_term(feats, self.config["ortho_normalize"])}
        c.tap.active = False
        try:
            terms.update(self.extra_terms({"images": images, "cond": cond, "classify": c.classify, "model": c.model,
                                           "grad_params": c.grad_params, "buffers": c.buffers, "mean": c.mean, "rng": c.rng}))
        finally:
            c.tap.active = True
        return logits, terms

    def result(self, c: GeneratorProblem, end, run: RunState, seed: int, out: str | Path | None) -> Reconstruction:
        candidates, labels, scores, predicted = self._draw(c.gen, c.classify, c.k, c.rng)
        per_class = [float((predicted[labels == k] == k).float().mean()) for k in range(c.k)]
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            save_file({n: t.detach().cpu().contiguous() for n, t in c.gen.state_dict().items()}, str(Path(out) / "generator.safetensors"))
        return Reconstruction(
            method=self.name, candidates=candidates, labels=labels, scores=scores,
            record=RunRecord(
                iterations=end.done, seconds=round(end.elapsed, 3),
                settings={**self.config, "hot_conditioning": self.hot, "features": c.tap.where, "num_classes": c.k,
                          "grad_mode_note": self.grad_note()},
                extras={"classifier_accuracy_on_candidates": float((predicted == labels).float().mean()),
                        "classifier_accuracy_per_class": per_class, "mean_label_probability": float(scores.mean())}),
            seed=seed, loss_history=run.history,
        )

    ramped: tuple[str, ...] = ()

    def extra_weights(self) -> dict[str, float]:
        return {}

    def ramp(self, it: int) -> float:
        w = self.config.get("warmup", 0.0) * self.config["steps"]
        return 1.0 if w <= 0 else min(1.0, it / w)

    def grad_note(self) -> str | None:
        return None

    def _draw(self, gen: ConditionedGenerator, classify, k: int, rng: torch.Generator):
        """``samples_per_class`` images per class (drawn in mixed batches), their labels, the
        classifier's probability of the label and its prediction."""
        n = self.config["samples_per_class"]
        labels = torch.arange(k).repeat_interleave(n)
        gen.train(self.config["sample_mode"] == "train")
        images, probs = [], []
        bs = max(self.config["batch_size"], 2)
        with torch.no_grad():
            for i in range(0, len(labels), bs):
                lab = labels[i:i + bs]
                if len(lab) < 2:  # batch norm in train mode needs two samples: pad and drop
                    lab = torch.cat([lab, lab])
                img, _ = gen.sample(len(lab), rng, hot=self.hot, labels=lab)
                img = img[: len(labels[i:i + bs])]
                images.append(img.cpu())
                probs.append(torch.softmax(classify(img), 1).cpu())
        gen.train()
        images_t, probs_t = torch.cat(images), torch.cat(probs)
        return images_t.float(), labels, probs_t[torch.arange(len(labels)), labels], probs_t.argmax(1)


@register
class InversionAttack(GeneratorAttack):
    """Network inversion with a conditioned generator (soft conditioning)."""

    name = "inversion"
    hot = False
    params = dict(COMMON_PARAMS)
