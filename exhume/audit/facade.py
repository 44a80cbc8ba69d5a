"""``exhume.audit(model, train=(x, y), unseen=x_unseen, ...)``: a user's module and arrays in, a verdict out.

A facade (docs/DESIGN.md, "The rooms above and below"): it wraps the model in the documented conventions
(:mod:`exhume.victim.wrap`), runs the public :func:`exhume.attack` with its budget, measures the
attack's assumptions on the user's training data (:mod:`exhume.evaluation.assumptions`), and
evaluates with :func:`exhume.evaluation.run.evaluate` on the arrays (the unseen images are the
pool and the control), then writes the report. It has no attack logic of its own.

Nothing that changes the result is assumed: the loss, the weight decay and the input
normalisation must be stated, or the audit is refused with a message naming the missing one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from exhume.errors import ConfigError, DataError
from exhume.evaluation.verdict import check_alpha
from exhume.files.fields import check_setting
from exhume.files.runfolder import holding_output

LOSS_NAMES = {"logistic": "logistic", "bce": "logistic", "bce-with-logits": "logistic", "binary-cross-entropy": "logistic",
              "cross-entropy": "cross-entropy", "ce": "cross-entropy"}
DEFAULT_SECONDS = 300.0


@dataclass
class AuditResult:
    """The verdict (``"leaks"``, ``"no evidence"``, ``"inconclusive"``), its reason, and every number."""

    verdict: str
    reason: str
    metrics: dict[str, Any]
    reconstruction: Any
    out: Path | None = None

    @property
    def report(self) -> Path | None:
        return None if self.out is None else self.out / "report.html"


def _tensor_images(x, what: str) -> torch.Tensor:
    from exhume.audit.loading import as_images

    return torch.from_numpy(as_images(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x, what))


def _normalisation(normalize, input_shape) -> tuple[torch.Tensor, torch.Tensor, str]:
    from exhume.victim.victim import broadcast_stat

    if normalize is None:
        raise ConfigError("normalize is not given: state the input normalisation the model was trained with, e.g. "
                          "--normalize 0.1307,0.3081 (mean, std per channel) or normalize=(mean, std), or 'none' "
                          "if the model takes raw [0, 1] pixels")
    if isinstance(normalize, str) and normalize.strip().lower() == "none":
        return torch.zeros(input_shape), torch.ones(input_shape), "none (raw [0, 1] pixels)"
    if not isinstance(normalize, (tuple, list)) or len(normalize) != 2:
        raise ConfigError(f"normalize must be (mean, std) or 'none', got {normalize!r}")
    mean = broadcast_stat(normalize[0], input_shape, "the normalisation mean")
    std = broadcast_stat(normalize[1], input_shape, "the normalisation std")
    if not torch.all(std > 0):
        raise ConfigError("the normalisation std must be > 0 everywhere")
    return mean, std, "(x - mean) / std"


def _head(model: nn.Module, sample: torch.Tensor, task: str | None, loss: str) -> tuple[str, str, int]:
    """(task, head, outputs) from the model's output on ``sample``; refuses a task that contradicts it."""
    try:
        with torch.no_grad():
            out = model.eval()(sample)
    except Exception as e:
        raise DataError(f"the model failed on a batch of the training images, shape {tuple(sample.shape)} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); its forward must take images (N, C, H, W), e.g. "
                        "start with nn.Flatten() for an MLP") from None
    if not isinstance(out, torch.Tensor) or out.shape[0] != sample.shape[0]:
        raise DataError(f"the model returned {type(out).__name__} {tuple(getattr(out, 'shape', ()))} for {sample.shape[0]} images; "
                        "expected a tensor of logits (N,), (N, 1) or (N, K)")
    k = int(out[0].numel())
    inferred = "binary" if k <= 2 else "multiclass"
    if task is not None and task != inferred:
        raise ConfigError(f"task {task!r} does not fit a model with {k} output(s): "
                          + ("a binary model has 1 or 2 logits" if task == "binary" else "a multiclass model has K > 2 logits"))
    if k == 2 and loss != "cross-entropy":
        raise ConfigError("a model with two logits is audited as a binary cross-entropy model (margin = logit[pos] - logit[neg]); "
                          f"loss {loss!r} over two logits is not supported: state loss 'cross-entropy'")
    if k == 1 and loss != "logistic":
        raise ConfigError(f"a model with one logit needs loss 'logistic' (BCE-with-logits), got {loss!r}")
    if k > 2 and loss != "cross-entropy":
        raise ConfigError(f"a model with {k} logits needs loss 'cross-entropy', got {loss!r}")
    return inferred, {1: "logit", 2: "two-logit"}.get(k, "logits"), k


def _labels(y, task: str, k: int, positive_class) -> tuple[torch.Tensor, Any]:
    """Labels in exhume's convention (binary ±1, multiclass ids) and the positive class used."""
    y = np.asarray(y).reshape(-1).astype(np.int64)
    values = sorted(set(y.tolist()))
    if task == "multiclass":
        if values[0] < 0 or values[-1] >= k:
            raise DataError(f"training labels range over {values[0]}..{values[-1]}; a model with {k} logits needs class ids 0..{k - 1}")
        return torch.from_numpy(y), None
    if len(values) > 2:
        raise DataError(f"training labels take {len(values)} values {values[:6]}; a binary model needs two")
    if k == 2 and not set(values) <= {0, 1}:
        raise DataError(f"training labels {values}: a two-logit model needs class ids 0 and 1 (the logit indices)")
    pos = max(values) if positive_class is None and k == 1 else (1 if positive_class is None else int(positive_class))
    if k == 2 and pos not in (0, 1):
        raise ConfigError(f"positive class {pos}: a two-logit model's positive class is 0 or 1")
    if positive_class is not None and pos not in values:
        raise ConfigError(f"positive class {pos} is not among the training labels {values}; expected one of them")
    return torch.from_numpy(np.where(y == pos, 1.0, -1.0).astype(np.float32)), pos


def _check_matching_size(n: int, method: str, attack_args: dict[str, Any]) -> None:
    """Refuse, before anything runs, a training set the evaluation's one-to-one matching would refuse after the attack.

    The evaluation pairs every training image with every candidate (``LIMITS.one_to_one_entries``);
    kkt makes at least ``m = candidates_per_point × n`` candidates per restart (2n by default), bilevel ``n``.
    """
    from exhume.attacks.kkt import KKTAttack, candidate_count
    from exhume.files import limits

    try:
        if method == "kkt":
            per_point = attack_args.get("candidates_per_point", KKTAttack.params["candidates_per_point"].default)
            m = candidate_count(attack_args.get("m"), per_point, int(attack_args.get("n_guess") or n))
        elif method == "bilevel":
            m = int(attack_args.get("m") or n)
        else:
            return
    except (TypeError, ValueError):  # a malformed setting: the attack's own validation names it
        return
    cap = limits.LIMITS.one_to_one_entries
    if n * m > cap:
        raise DataError(f"{n} training images: the evaluation matches every training image with every candidate, and the {method} "
                        f"attack makes at least {m} candidates ({n * m:,} pairs), over the limit of {cap:,} pairs "
                        f"(LIMITS.one_to_one_entries); with {m / n:g} candidates per image at most {int((cap / (m / n)) ** 0.5):,} "
                        "training images can be audited")


@holding_output(lambda a: a["out"])  # one lock for the attack, the evaluation and the report written into out
def audit(model: nn.Module, train, unseen, *, loss: str | None = None, weight_decay: float | None = None, normalize=None,
          task: str | None = None, positive_class: int | None = None, max_seconds: float = DEFAULT_SECONDS,
          method: str = "kkt", attack_args: dict[str, Any] | None = None, alpha: float = 0.05, out: str | Path | None = None,
          seed: int = 0, device: str = "cpu", progress: bool = True, settings: dict[str, Any] | None = None,
          force: bool = False, resume: bool = False) -> AuditResult:
    """Audit ``model`` (trained on ``train = (x, y)``) for training-data leakage; see the module docstring.

    ``x``: display-space images (floats in [0, 1] or uint8), ``(N, C, H, W)``, ``(N, H, W)`` or
    ``(N, H, W, C)``; ``unseen``: images of the same kind the model never saw (pool and control).
    ``loss``: ``"logistic"`` (BCE-with-logits, one logit) or ``"cross-entropy"`` (two or more
    logits). ``weight_decay``: the L2 coefficient ``w`` of ``mean loss + (w/2)‖θ‖²``, i.e. the
    ``weight_decay`` of ``torch.optim.SGD``/``Adam`` (0 for none). ``normalize``: ``(mean, std)``
    (scalars, per channel, or images) the model's inputs were normalised with, or ``"none"``.
    ``force=True`` replaces an earlier audit's attack run in ``out``; ``resume=True`` continues an
    interrupted one (same model, data and settings) and judges it.
    """
    import exhume  # the public exhume.attack: whatever runs it (e.g. a restart portfolio) applies here
    from exhume.evaluation.assumptions import fit_failure, relative_stationarity, scale_failure, stationarity_failure, unmodelled_layers
    from exhume.evaluation.run import evaluate, margins_of
    from exhume.report import write_report
    from exhume.victim import AttackerView
    from exhume.victim.wrap import Audited

    t0 = time.perf_counter()
    if loss is None:
        raise ConfigError("loss is not given: state the training loss, 'logistic' (BCE-with-logits) or 'cross-entropy'")
    if str(loss).lower() not in LOSS_NAMES:
        raise ConfigError(f"unknown loss {loss!r}; expected one of {', '.join(LOSS_NAMES)}")
    loss = LOSS_NAMES[str(loss).lower()]
    if weight_decay is None:
        raise ConfigError("weight_decay is not given: state the L2 weight decay the model was trained with "
                          "(the weight_decay of torch.optim.SGD/Adam; 0 for none); it changes the attack's equation")
    weight_decay = check_setting("weight_decay", weight_decay, low=0.0)  # the field checks of the files: finite, in range
    alpha = check_alpha(alpha)
    max_seconds = check_setting("max_seconds (the attack's budget in seconds)", max_seconds, positive=True)
    seed = check_setting("seed", seed, integer=True)
    positive_class = check_setting("positive_class", positive_class, integer=True, optional=True)
    if not isinstance(train, (tuple, list)) or len(train) != 2:
        raise ConfigError("train must be (x, y): the training images and their labels")
    x = _tensor_images(train[0], "training images")
    unseen_x = _tensor_images(unseen[0] if isinstance(unseen, (tuple, list)) else unseen, "unseen images")
    if len(train[1]) != len(x):
        raise DataError(f"{len(x)} training images but {len(train[1])} labels")
    _check_matching_size(len(x), method, attack_args or {})
    if tuple(unseen_x.shape[1:]) != tuple(x.shape[1:]):
        raise DataError(f"unseen images have shape {tuple(unseen_x.shape[1:])}, training images {tuple(x.shape[1:])}; expected the same")
    input_shape = tuple(x.shape[1:])
    mean, std, norm_text = _normalisation(normalize, input_shape)
    user = model.float().eval()
    task, head, k = _head(user, ((x[:2] - mean) / std), task, loss)
    y, pos = _labels(train[1], task, k, positive_class)
    wrapped = Audited(user, std, head, positive=1 if pos is None or head != "two-logit" else pos).eval()
    if head == "two-logit":
        loss = "logistic"  # cross-entropy over two logits is the logistic loss of their difference
    centred = x - mean
    failures = unmodelled_layers(wrapped, centred[:2])
    measured = relative_stationarity(wrapped, centred, y, loss, float(weight_decay))
    failures += stationarity_failure(measured)
    view = AttackerView(model=wrapped, task=task, input_shape=input_shape, mean=mean, loss=loss,
                        weight_decay=float(weight_decay), num_classes=k if task == "multiclass" else None, n_train_hint=len(x))
    out = None if out is None else Path(out)
    kwargs = {"iterations": 10_000_000, "max_seconds": float(max_seconds), **(attack_args or {})}
    recon = exhume.attack(view, method=method, seed=seed, out=out, device=device, progress=progress, force=force,
                          resume=resume, **kwargs)
    margins, support_margins = margins_of(wrapped, centred, y, task, loss)
    failures += fit_failure(margins, float(weight_decay)) + scale_failure(recon, margins, float(weight_decay))
    result = evaluate(recon, train=(x, None), unseen=unseen_x, margins=margins, support_margins=support_margins,
                      assumptions=failures, alpha=alpha,
                      out=None if out is None else out / "evaluation")
    m = result.metrics
    m["victim"] = {"model": type(user).__name__, "task": task, "outputs": k, "positive_class": pos, "loss": loss,
                   "weight_decay": float(weight_decay), "normalisation": norm_text, "n_train": len(x), "n_unseen": len(unseen_x),
                   "stationarity_residual": measured["value"], "stationarity_definition": measured["definition"],
                   "stationarity_limit": measured["limit"],
                   "train_accuracy": float((torch.as_tensor(margins) > 0).double().mean())}
    m["audit"] = {**(settings or {}), "method": method, "max_seconds": float(max_seconds), "seed": seed,
                  "wall_seconds": round(time.perf_counter() - t0, 1)}
    if out is not None:
        result.save(out / "evaluation")
        write_report(out)
    return AuditResult(verdict=m["verdict"], reason=m["verdict_reason"], metrics=m, reconstruction=recon, out=out)

