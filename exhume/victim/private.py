"""Differentially private training of a victim through Opacus (DP-SGD), an optional extra: ``pip install "exhume[dp]"``.

Opacus's ``PrivacyEngine`` makes the model, the optimiser and the data loader private: Poisson
sampling of every batch, each sample's gradient clipped to ``max_grad_norm`` (flat, over all
parameters), Gaussian noise of standard deviation ``noise_multiplier · max_grad_norm`` added to
their sum. For a target ``(ε, δ)`` its ``make_private_with_epsilon`` solves the noise multiplier
with its accountant over the planned steps; at the end the accountant reports the ε spent. Nothing
here clips, samples or accounts by hand.

- Full batch (:class:`~exhume.victim.TrainConfig`): sampling rate 1, one step per epoch, ``max_epochs``
  steps planned; gradient descent or Adam. Mini-batch (:class:`~exhume.victim.MiniBatchConfig`):
  sampling rate ``1 / ⌈n / batch_size⌉`` (Opacus's), ``epochs`` planned; SGD with momentum or Adam.

Weight decay is the optimiser's ``weight_decay``, applied to the noised gradient: post-processing,
it costs no privacy, and the objective stays ``mean loss + (w/2)·‖θ‖²``. Stopping rules that read
the training loss are refused (they are not private); ``max_seconds`` may stop early, and the ε
recorded is then the one spent. Per-sample norms are Opacus's ghost clipping by default (exact for
linear layers; checked against its per-sample gradients, ``grad_sample_mode="hooks"``, in the tests).
``noise_multiplier=0`` clips without noise: not private (ε = ∞), the control that separates
clipping's own effect from the noise's. The trained module is the one passed in, unwrapped, with
its own parameter names.

The batches' sampling and the noise are drawn from a seed taken from the operating system and never
recorded (``noise_seed=None``); a ``noise_seed`` makes them replayable, for experiments only (whoever
holds the record can subtract the noise), and ``secure_mode`` is Opacus's (a cryptographically secure
generator, from ``torchcsprng``). Opacus's gdp accountant, a central-limit approximation, is refused
at sampling rate 1 and labelled below it. Opacus's warnings pass through but three that are handled
here: the secure generator's (recorded as ``secure_mode``), the accountant's range of orders (recorded
as ``accountant_warnings``) and ghost clipping's backward hooks (internal). The record
(:func:`train_private`'s ``"dp"``) holds what :mod:`exhume.privacy` reads (docs/METHODS.md §7).
"""

from __future__ import annotations

import math
import re
import secrets
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from exhume.errors import ConfigError, DivergenceError
from exhume.files.fields import check_setting
from exhume.losses import per_sample_loss
from exhume.progress import Progress

#: Opacus's accountants (``PrivacyEngine(accountant=...)``); rdp is the default here: prv's memory grows with full-batch steps
ACCOUNTANTS = ("rdp", "prv", "gdp")
#: how Opacus computes per-sample gradient norms (``grad_sample_mode``)
GRAD_SAMPLE_MODES = ("ghost", "hooks")
#: what Opacus's gdp accountant is (its record's ``accountant_note``)
GDP_NOTE = ("Opacus's gdp accountant: a central-limit approximation for small sampling rates and many steps (Bu et al. "
            "2020), not an upper bound on ε")
#: the Opacus warnings handled here (by message): the secure generator's, recorded as secure_mode; ghost clipping's
#: backward hooks, internal to Opacus; the accountant's range of orders, recorded as accountant_warnings
HANDLED = {"secure": re.compile(r"Secure RNG turned off"), "hooks": re.compile(r"Full backward hook is firing"),
           "orders": re.compile(r"Optimal order is the (smallest|largest) alpha")}
INSTALL = 'pip install "exhume[dp]"'


def require_opacus():
    """The ``opacus`` module, or one line saying which extra installs it."""
    try:
        import opacus
    except ImportError:
        raise ConfigError(f"differentially private training (--dp-epsilon) needs Opacus: {INSTALL}") from None
    return opacus


@dataclass
class DPConfig:
    """DP-SGD's settings: a target ``epsilon`` (with ``delta``), or a ``noise_multiplier`` (0: clipping only)."""

    epsilon: float | None = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0
    noise_multiplier: float | None = None
    accountant: str = "rdp"
    grad_sample_mode: str = "ghost"
    noise_seed: int | None = None
    secure_mode: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """One line per bad setting: exactly one of ``epsilon`` and ``noise_multiplier``, each in range."""
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise ConfigError("differential privacy needs exactly one of epsilon (--dp-epsilon, the accountant solves the noise) "
                              "and noise_multiplier (--dp-noise-multiplier; 0 clips without noise)")
        check_setting("epsilon", self.epsilon, positive=True, optional=True)
        check_setting("noise_multiplier", self.noise_multiplier, low=0.0, optional=True)
        check_setting("delta", self.delta, positive=True, high=1.0)
        check_setting("max_grad_norm", self.max_grad_norm, positive=True)
        if self.accountant not in ACCOUNTANTS:
            raise ConfigError(f"unknown accountant {self.accountant!r}; Opacus's: {', '.join(ACCOUNTANTS)}")
        if self.grad_sample_mode not in GRAD_SAMPLE_MODES:
            raise ConfigError(f"unknown grad_sample_mode {self.grad_sample_mode!r}; known: {', '.join(GRAD_SAMPLE_MODES)}")
        if self.noise_seed is not None and (isinstance(self.noise_seed, bool) or not isinstance(self.noise_seed, int)
                                            or self.noise_seed < 0):
            raise ConfigError(f"noise_seed must be an integer ≥ 0 or None (a secret seed), got {self.noise_seed!r}")
        if not isinstance(self.secure_mode, bool):
            raise ConfigError(f"secure_mode must be True or False, got {self.secure_mode!r}")
        if self.secure_mode and self.noise_seed is not None:
            raise ConfigError("secure_mode draws the noise from the operating system: a noise_seed would make it replayable; "
                              "give one or the other")

    @property
    def clipping_only(self) -> bool:
        return self.noise_multiplier == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Loss(nn.Module):
    """exhume's loss as the criterion Opacus's ghost clipping calls (it sets ``reduction`` to ``"none"`` and back)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.reduction = name, "mean"

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        each = per_sample_loss(self.name, _logits(out), y)
        if self.reduction == "none":
            return each
        return each.sum() / max(len(each), 1)  # an empty Poisson batch: 0, not NaN


def _logits(out: torch.Tensor) -> torch.Tensor:
    """A one-logit model's ``(N, 1)`` output as exhume's losses take it, ``(N,)``."""
    return out.squeeze(1) if out.dim() == 2 and out.shape[1] == 1 else out


def _optimizer(model: nn.Module, train) -> torch.optim.Optimizer:
    """Plain torch optimiser; weight decay is its own (post-processing of the noised gradient)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if train.optimizer == "adam":
        return torch.optim.Adam(params, lr=train.lr, weight_decay=train.weight_decay)
    # full-batch gradient descent (TrainConfig: no momentum) or mini-batch SGD with its momentum
    return torch.optim.SGD(params, lr=train.lr, momentum=getattr(train, "momentum", 0.0), weight_decay=train.weight_decay)


def check_private_model(model: nn.Module) -> None:
    """Refuse, in one line, a model Opacus cannot make private (BatchNorm, …), naming Opacus's reasons."""
    from opacus.validators import ModuleValidator

    was = model.training
    errors = ModuleValidator.validate(model.train(), strict=False)
    model.train(was)
    if errors:
        reasons = "; ".join(dict.fromkeys(" ".join(str(e).split()) for e in errors))
        raise ConfigError(f"Opacus cannot make {type(model).__name__} private: {reasons} (replace BatchNorm by GroupNorm, "
                          "e.g. with opacus.validators.ModuleValidator.fix, or train without differential privacy)")


def _make_private(engine, model, opt, loader, loss: str, dp: DPConfig, epochs: int, seed: int):
    """Opacus's private model, optimiser, criterion and Poisson loader; an ε it cannot reach is one line. ``seed``
    seeds the noise (Opacus's secure generator replaces it in secure mode)."""
    common = {"module": model, "optimizer": opt, "data_loader": loader, "criterion": _Loss(loss), "max_grad_norm": dp.max_grad_norm,
              "poisson_sampling": True, "grad_sample_mode": dp.grad_sample_mode,
              "noise_generator": None if dp.secure_mode else
              torch.Generator(device=next(model.parameters()).device).manual_seed(seed)}
    try:
        if dp.epsilon is not None:
            made = engine.make_private_with_epsilon(target_epsilon=dp.epsilon, target_delta=dp.delta, epochs=epochs, **common)
        else:
            made = engine.make_private(noise_multiplier=dp.noise_multiplier, **common)
    except ValueError as e:
        if dp.epsilon is None or "budget" not in str(e):
            raise
        steps = epochs * len(loader)
        raise ConfigError(f"ε = {dp.epsilon:g} (δ = {dp.delta:g}) cannot be reached in {steps} steps at sampling rate "
                          f"{1 / len(loader):.4g}: Opacus's {dp.accountant} accountant finds no noise multiplier up to 1e6 "
                          f"({e}); ask for a larger ε or train fewer epochs") from None
    if dp.grad_sample_mode == "ghost":
        return made
    private, optimizer, data = made
    return private, optimizer, _Loss(loss), data


def _epoch(private, opt, criterion, loader, epoch: int, lr: float) -> tuple[float, int, int]:
    """One pass over Opacus's Poisson loader; returns ``(summed loss, samples seen, steps)``."""
    total, seen, steps = 0.0, 0, 0
    for xb, yb in loader:
        opt.zero_grad(set_to_none=True)
        loss = criterion(private(xb), yb)
        loss.backward()
        opt.step()
        value = float(loss.detach()) if len(xb) else 0.0  # an empty Poisson batch: a step of noise alone
        if not math.isfinite(value):
            raise DivergenceError(f"private training diverged at epoch {epoch}; lower the learning rate (lr={lr})")
        total, seen, steps = total + value * len(xb), seen + len(xb), steps + 1
    return total, seen, steps


def _loop(private, opt, criterion, loader, train, epochs: int, progress: bool) -> dict[str, Any]:
    """The planned epochs (or fewer, at ``max_seconds``): loss history, steps taken, why it stopped."""
    start, history, steps, stop_reason, epoch = time.perf_counter(), [], 0, "epochs", 0
    every = getattr(train, "log_every", 1)
    bar = Progress("train victim (DP-SGD)", epochs, train.max_seconds, unit="ep", disable=not progress)
    try:
        for epoch in range(1, epochs + 1):
            total, seen, taken = _epoch(private, opt, criterion, loader, epoch, train.lr)
            steps += taken
            if epoch % every == 0 or epoch == 1:
                history.append((epoch, total / max(seen, 1)))
                bar.update(epoch, loss=f"{total / max(seen, 1):.3g}")
            if train.max_seconds is not None and time.perf_counter() - start > train.max_seconds:
                stop_reason = "max_seconds"
                break
    finally:
        bar.close()
    return {"epochs": epoch, "steps": steps, "seconds": round(time.perf_counter() - start, 3), "stop_reason": stop_reason,
            "loss_history": history}


def train_private(model: nn.Module, x: torch.Tensor, y: torch.Tensor, train, dp: DPConfig, seed: int = 0,
                  progress: bool = True) -> dict[str, Any]:
    """Train ``model`` in place with DP-SGD (see the module docstring); returns metrics with the ``"dp"`` record. Leaves it in
    eval mode. ``seed`` is the victim's (its data and initialisation); the sampling and the noise are ``dp``'s."""
    from torch.utils.data import DataLoader, TensorDataset

    opacus = require_opacus()
    dp.validate()
    full = not hasattr(train, "batch_size")
    if full and any(getattr(train, k, None) is not None for k in ("loss_threshold", "residual_threshold", "span_threshold")):
        raise ConfigError("differentially private training runs its planned epochs (the accountant's ε is theirs): a stopping "
                          "rule on the training loss, the stationarity residual or the weights' spectrum (loss_threshold, "
                          "residual_threshold, span_threshold) is refused with it")
    check_private_model(model)
    epochs = train.max_epochs if full else train.epochs
    sampling, noise = (dp.noise_seed, dp.noise_seed + 1) if dp.noise_seed is not None else (secrets.randbits(63), secrets.randbits(63))
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x) if full else min(train.batch_size, len(x)),
                        generator=torch.Generator().manual_seed(sampling))
    _check_accountant(dp, 1.0 / len(loader))
    model.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = _engine(opacus, dp)
        private, opt, criterion, data = _make_private(engine, model, _optimizer(model, train), loader, train.loss, dp, epochs, noise)
        try:
            metrics = _loop(private, opt, criterion, data, train, epochs, progress)
        finally:
            private.to_standard_module()  # hooks and per-sample attributes removed: the plain module, its own names
            model.eval()
        spent = None if dp.clipping_only else float(engine.get_epsilon(dp.delta))
    metrics["dp"] = {**_record(opacus, dp, opt, data, epochs, metrics["steps"], spent), **_warnings_passed(caught)}
    with torch.no_grad():
        metrics["final_loss"] = float(torch.cat([per_sample_loss(train.loss, _logits(model(x[i:i + 1000])), y[i:i + 1000])
                                                 for i in range(0, len(x), 1000)]).mean())
    return {**metrics, "stationarity_residual": None}


def _check_accountant(dp: DPConfig, rate: float) -> None:
    """gdp at sampling rate 1 is refused: its central-limit approximation is made for small rates."""
    if dp.accountant == "gdp" and rate >= 1.0 and not dp.clipping_only:
        raise ConfigError("Opacus's gdp accountant is a central-limit approximation made for small sampling rates; at "
                          "sampling rate 1 (the full batch) it misstates ε (the mechanism is exactly √T/σ-GDP): use the rdp "
                          "or prv accountant")


def _engine(opacus, dp: DPConfig):
    """Opacus's PrivacyEngine; secure mode without ``torchcsprng`` is one line."""
    try:
        return opacus.PrivacyEngine(accountant=dp.accountant, secure_mode=dp.secure_mode)
    except ImportError:
        raise ConfigError("Opacus's secure mode (--dp-secure-mode) needs the torchcsprng package built for your torch "
                          f"{torch.__version__.split('+')[0]}; install it, or train without secure mode") from None


def _warnings_passed(caught) -> dict[str, Any]:
    """Re-emit every warning but those handled here (:data:`HANDLED`); the accountant's range of orders, recorded."""
    orders = []
    for w in caught:
        text = str(w.message)
        if HANDLED["orders"].search(text):
            orders.append(text)
        elif not (HANDLED["secure"].search(text) or HANDLED["hooks"].search(text)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return {"accountant_warnings": list(dict.fromkeys(orders))}


def _record(opacus, dp: DPConfig, opt, loader, epochs: int, steps: int, spent: float | None) -> dict[str, Any]:
    """What the victim folder records of its privacy (``train_config["dp"]``)."""
    randomness = ("secure: Opacus's secure mode (torchcsprng)" if dp.secure_mode
                  else f"seeded (noise_seed {dp.noise_seed}): whoever holds this record can replay the sampling and the noise; "
                  "for experiments, not private" if dp.noise_seed is not None
                  else "secret: seeds drawn from the operating system and not recorded (torch's generator, not Opacus's "
                  "secure mode)")
    return {"library": f"opacus {opacus.__version__}", "mechanism": "clipping only (no noise): not private" if dp.clipping_only
            else "DP-SGD", "epsilon": dp.epsilon, "delta": dp.delta, "accountant": dp.accountant,
            "accountant_note": GDP_NOTE if dp.accountant == "gdp" else None,
            "noise_multiplier": float(opt.noise_multiplier), "max_grad_norm": dp.max_grad_norm, "sample_rate": 1.0 / len(loader),
            "expected_batch_size": opt.expected_batch_size, "poisson_sampling": True, "clipping": "flat (all parameters)",
            "grad_sample_mode": dp.grad_sample_mode, "planned_steps": epochs * len(loader), "steps": steps,
            "epsilon_spent": spent, "secure_mode": dp.secure_mode, "randomness": randomness}
