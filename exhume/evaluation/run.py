"""Evaluate a Reconstruction against a training set (a victim's, or plain arrays), with a verdict, and write the figures."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from exhume.attacks import Equation, Stationarity
from exhume.errors import ConfigError, DataError, VictimError
from exhume.evaluation.assumptions import attack_failures, checks_for, equation_of
from exhume.evaluation.matching import match as match_images  # evaluate()'s parameter `match` shadows the name
from exhume.evaluation.matching import min_distances
from exhume.evaluation.metrics import EvalResult, evaluate_images
from exhume.evaluation.plots import candidates_grid, pairs_grid, plot_sorted_ssim, plot_ssim_vs_margin
from exhume.evaluation.verdict import ALPHA, check_alpha, decide
from exhume.files.records import jsonable
from exhume.files.runfolder import holding_output
from exhume.losses import margin, soft_margin, weighs_by_soft_margin


def _float32(model):
    """``model`` in float32 for the margins, a copy when it is not (a victim's weights are never converted in place:
    its fingerprint stays the one its attacks recorded)."""
    if any(p.dtype != torch.float32 for p in model.parameters()):
        model = copy.deepcopy(model).float()
    return model.eval()


def margins_of(model, centred, y, task: str, loss: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The training margins and the margins for the support estimate, from one forward pass.

    The first: ``y_i Φ(x_i)``; multiclass, the runner-up margin ``Φ_y − max_{k≠y} Φ_k`` (a point is
    fitted when it is positive). The second, where the loss weighs point ``i`` by
    ``σ(−soft margin) = 1 − p_y`` (:func:`exhume.losses.weighs_by_soft_margin`: multiclass with
    cross-entropy or unknown loss), the soft margins ``Φ_y − log Σ_{k≠y} exp Φ_k``; else None (the first serves).
    """
    with torch.no_grad():
        out = model(centred)
        support = soft_margin(out, y).double().numpy() if weighs_by_soft_margin(task, loss) else None
        return margin(out, y).double().numpy(), support


@holding_output(lambda a: a["out"])  # the run folder's lock (RUN/evaluation) or out's own, while it evaluates and writes
def evaluate(recon, victim=None, *, train=None, unseen=None, margins=None, assumptions: list[str] | None = None,
             alpha: float = ALPHA, pool_size: int = 1000, match: str = "ssim", out: str | Path | None = None,
             pool_seed: int = 1, figures: bool = True, support_margins=None, threat_model: str | None = None,
             owner_findings: dict[str, Any] | None = None, candidate_scale: str = "clip") -> EvalResult:
    """Judge ``recon`` (its candidates in display space) against a training set; return metrics with a verdict.

    Two forms:

    - ``evaluate(recon, victim)``: ``victim``'s training set is rebuilt from its saved data spec
      (refused if it does not reproduce the saved training indices); the pool of unseen images
      comes from the same dataset and classes, disjoint from the training indices (``pool_size``
      images, seeded).
    - ``evaluate(recon, train=(x, y), unseen=x_unseen)``: plain arrays in display space, ``(N, C, H, W)``
      or ``(N, H, W)``, floats in [0, 1] or uint8. ``unseen`` images (never trained on) are split,
      seeded by ``pool_seed``, into the control (as many as the training images, at most half) and
      the pool (the rest). ``margins``: each training image's margin, optional;
      ``support_margins``: the margins whose ``σ(−·)`` is each point's weight in the loss, for the
      support estimate (the soft margins of a cross-entropy multiclass model; default ``margins``).
      With a victim both are computed.

    **Control.** The control images are judged exactly like the training images: how many of them
    does a candidate match better than the best pool image? ``"memorised_control"`` is that
    count, the baseline the memorisation count must beat; ``"memorised_control_oracle"`` (ORACLE,
    it reads the training images) is the control the training images themselves would score as the
    candidates, the level a faithful reconstruction approaches. **Verdict** (``"verdict"``,
    ``"verdict_reason"``, ``"p_value"``, ``"alpha"``; see :mod:`exhume.evaluation.verdict`):
    *leaks* when memorised is significantly above the control (one-sided Fisher exact test,
    ``p < alpha``); else *inconclusive* when an assumption of the attack failed (``assumptions``:
    reasons in plain words, plus the attack's own final residual and, for a victim, its
    stationarity and layers), else *no evidence*. With ``out``, writes ``metrics.json``,
    ``arrays.npz`` and the figures there. ``threat_model``: what the attacker knew, in words (default:
    what the run recorded, e.g. ``"weights only"``); metrics.json and the verdict's reason state it.
    ``owner_findings``: fields the verdict reads, measured by the audit (``identifiability``, ``membership_exposure``,
    ``layers``).
    ``candidate_scale``: ``"clip"`` (default) or ``"minmax"``, each candidate rescaled by its own range before
    matching, the same candidate images against training images, pool and control (:data:`CANDIDATE_SCALES`).
    """
    t0 = time.perf_counter()
    alpha = check_alpha(alpha)
    equation = equation_of(recon.method, recon=recon)  # which assumptions of the attack to check
    given = _inputs(recon, victim, train, unseen, margins, support_margins, assumptions, pool_size, pool_seed, equation)
    candidates = scaled_candidates(recon.candidates, candidate_scale)
    result = _matched(recon, candidates, given, match)
    failures = given.failures + attack_failures(recon)
    if victim is not None:
        failures += checks_for(equation).run_failures(recon, given.margins, float(victim.weight_decay or 0.0))
    _judged(result, recon, failures, alpha, threat_model, owner_findings)
    result.metrics.evaluation_seconds = round(time.perf_counter() - t0, 3)
    if candidate_scale != "clip":
        result.metrics.extra["candidate_scale"] = CANDIDATE_SCALES[candidate_scale]
    if out is not None:
        _write(result, candidates, given.train_x, given.pool, Path(out), figures)
    return result


def _matched(recon, candidates: torch.Tensor, given: _Given, match: str) -> EvalResult:
    """The candidates matched against the training images, the pool and the control, with the run's and the victim's context."""
    if tuple(candidates.shape[1:]) != tuple(given.train_x.shape[1:]):
        raise DataError(f"the reconstruction's candidates have shape {tuple(candidates.shape[1:])} but the training images "
                        f"have {tuple(given.train_x.shape[1:])}; evaluate against the data the attacked model takes")
    result = evaluate_images(candidates, given.train_x, given.pool, margins=given.margins,
                             support_margins=given.support_margins, match=match)
    _restarts(result, recon, candidates, given.train_x, match)
    _control(result, candidates, given.control, given.pool, match, given.train_x)
    _context(result, recon, candidates, given)
    return result


def _judged(result: EvalResult, recon, failures: list[str], alpha: float, threat_model: str | None,
            owner_findings: dict[str, Any] | None) -> None:
    """The threat model, the owner's findings and the verdict into ``result``'s metrics."""
    # what the attacker knew, as the caller (the audit) states it or the run recorded it; the verdict's reason names it
    threat = threat_model or recon.record.threat_model
    unused = recon.record.start_unused  # a known start the attack left out, and why
    result.metrics.threat_model = f"{threat}; solved {unused}" if threat and unused else threat
    vars(result.metrics).update(owner_findings or {})  # plain dataclass fields of Metrics
    result.metrics.set_verdict(decide(result.metrics, failures, alpha))


#: how candidates are brought to display space before matching (``candidate_scale``): every rule acts on each candidate alone,
#: so training images, pool and control are matched against the same images and the control stays honest
CANDIDATE_SCALES = {"clip": "clipped to [0, 1]",
                    "minmax": "each candidate rescaled to [0, 1] by its own minimum and maximum (scale- and offset-free: "
                              "for attacks that fix a training image only up to a positive scale)"}


def scaled_candidates(candidates: torch.Tensor, rule: str = "clip") -> torch.Tensor:
    """``candidates`` in display space by ``rule`` (:data:`CANDIDATE_SCALES`)."""
    if rule not in CANDIDATE_SCALES:
        raise ConfigError(f"unknown candidate_scale {rule!r}; expected one of {', '.join(CANDIDATE_SCALES)}")
    c = candidates.float()
    if rule == "clip":
        return c.clamp(0, 1)
    flat = c.reshape(len(c), -1)
    lo, hi = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    return ((flat - lo) / (hi - lo).clamp_min(1e-12)).reshape(c.shape)


class _Given(NamedTuple):
    """What evaluate() judges against: the training images, the control and the pool, and what it knows of the model."""

    train_x: torch.Tensor
    control: torch.Tensor | None
    pool: torch.Tensor | None
    description: str | None
    margins: Any
    support_margins: Any
    failures: list[str]
    info: dict[str, Any]


def _inputs(recon, victim, train, unseen, margins, support_margins, assumptions, pool_size: int, pool_seed: int,
            equation: Equation) -> _Given:
    if victim is not None and (train is not None or unseen is not None):
        raise ConfigError("evaluate() takes a victim or train=(x, y) and unseen=x, not both")
    if victim is not None and not hasattr(victim, "load_train_set"):
        raise ConfigError(f"evaluate() got a {type(victim).__name__}, which holds no training data: pass the Victim, or "
                          "train=(x, y) and unseen=x_unseen as arrays")
    if victim is None:
        if train is None or unseen is None:
            raise ConfigError("evaluate() needs a victim, or train=(x, y) and unseen=x (images the model never saw)")
        train_x, control, pool, description = _arrays(train, unseen, pool_seed)
        return _Given(train_x, control, pool, description, margins, support_margins, list(assumptions or []), {})
    check_attacked(recon, victim)
    train_set, control, pool, description = _victim_sets(victim, pool_size, pool_seed)
    margins = support_margins = None
    if victim.task != "regression":
        margins, support_margins = margins_of(_float32(victim.model), train_set.centred.float(), train_set.y,
                                              victim.task, victim.loss)
    failures = list(assumptions or []) + victim_failures(victim, train_set, equation)
    return _Given(train_set.x, control, pool, description, margins, support_margins, failures, victim_info(victim, train_set))


def _restarts(result: EvalResult, recon, candidates, train_x, match: str) -> None:
    """A pooled portfolio: which restarts found each memorised image."""
    members = getattr(recon, "provenance", {}).get("members")
    if members is None or "memorised" not in result.arrays:
        return
    from exhume.evaluation.restarts import restart_breakdown

    extra, arrays = restart_breakdown(candidates, train_x, result.arrays["pool_ssim"], members, result.arrays["memorised"], match)
    result.metrics.update(extra)
    result.arrays.update(arrays)


def _context(result: EvalResult, recon, candidates, given: _Given) -> None:
    """The pool's description, the membership AUC, the attack's and the victim's settings."""
    m = result.metrics
    m.pool_description = given.description
    if given.pool is not None:
        from exhume.evaluation.membership import membership_uncertainty

        mu = membership_uncertainty(candidates, given.train_x, given.pool)
        m.membership_auc = jsonable(mu["auc"])
        m.membership = jsonable({k: v for k, v in mu.items() if k not in ("d_train", "d_heldout")})
    m.attack = jsonable({"method": recon.method, "seed": recon.seed, "config": recon.record.config_json(), **recon.record.summary_json()})
    m.victim = jsonable(given.info)


def check_attacked(recon, victim) -> None:
    """Refuse a victim whose weights are not those ``recon`` was attacked from (by the fingerprint
    the reconstruction records; a reconstruction without one, saved by older versions, is not checked)."""
    recorded = getattr(recon, "victim_fingerprint", None)
    if recorded is None:
        return
    from exhume.files.runfolder import fingerprint

    given = fingerprint(victim.model)
    if given != recorded:
        source = f"victim {recon.victim_path}" if getattr(recon, "victim_path", None) else "another victim"
        target = f"victim {victim.path}" if getattr(victim, "path", None) is not None else "the given victim"
        raise VictimError(f"the reconstruction was attacked from {source} (weights fingerprint {recorded}), not from {target} "
                          f"(fingerprint {given}); evaluate it against the victim it was made from")


def _as_display(x, what: str) -> torch.Tensor:
    from exhume.evaluation.ssim import as_images

    x = np.asarray(x)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    return as_images(torch.as_tensor(np.asarray(x, dtype=np.float32)), what)


def _arrays(train, unseen, pool_seed: int):
    x = train[0] if isinstance(train, (tuple, list)) else train
    train_x = _as_display(x, "training images")
    u = unseen[0] if isinstance(unseen, (tuple, list)) else unseen
    unseen_x = _as_display(u, "unseen images")
    if len(unseen_x) < 2:
        raise DataError(f"got {len(unseen_x)} unseen image(s); need at least 2 (a control and a pool), ideally several hundred")
    order = torch.randperm(len(unseen_x), generator=torch.Generator().manual_seed(pool_seed))
    n_control = min(len(train_x), len(unseen_x) // 2)
    control, pool = unseen_x[order[:n_control]], unseen_x[order[n_control:]]
    return train_x, control, pool, (f"{len(pool)} of the given unseen images (the other {n_control} are the control), "
                                    f"split with seed {pool_seed}")


def _victim_sets(victim, pool_size: int, pool_seed: int):
    from exhume.data import dataset_of, make_pool

    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 0:
        raise ConfigError(f"pool_size must be a non-negative integer (0: no memorisation count), got {pool_size!r}")
    ds = dataset_of(victim.data_spec) if victim.data_spec is not None else None  # read once: training set and pool
    train = victim.load_train_set(ds)
    pool = control = None
    if pool_size > 0:
        unseen = make_pool(ds, train.spec["task"], pool_size + len(train), exclude=train.indices, seed=pool_seed)
        order = torch.randperm(len(unseen), generator=torch.Generator().manual_seed(pool_seed))
        n_control = max(0, min(len(train), len(unseen) - 1))
        control, pool = unseen.x[order[:n_control]], unseen.x[order[n_control:]]
    description = None if pool is None else (
        f"{len(pool)} unseen images of the same classes from {train.spec['dataset']}, disjoint from the training set "
        f"and from the {0 if control is None else len(control)} control images (seed {pool_seed})")
    return train, control, pool, description


def _control(result: EvalResult, candidates, control, pool, match: str, train_x=None) -> None:
    if control is None or len(control) == 0 or pool is None:
        return
    ctrl = evaluate_images(candidates, control, pool, match=match)
    m = result.metrics
    m.memorised_control = ctrl.metrics.memorised
    m.control_size = len(control)
    m.one_to_one_control = ctrl.metrics.one_to_one_at[0.4]
    m.memorised_control_note = (
        "the memorisation count computed for unseen images (non-members) in place of the training images; "
        "a leak shows as memorised well above memorised_control")
    if train_x is not None:
        m.control_exact_copies_of_train = int((min_distances(train_x, control)[0] < 1e-4).sum())
        # ORACLE (evaluator-side, uses the training images): the control a perfect reconstruction would score
        # each control image's nearest training image against its best pool image (the control's own, computed above)
        nearest = match_images(control, train_x, match, one_to_one_too=False)["ssim"]
        m.memorised_control_oracle = int((nearest > ctrl.arrays["pool_ssim"]).sum())
        m.memorised_control_oracle_note = (
            "ORACLE: the control count if the candidates were the training images themselves (control images that look more "
            "like some training image than like any pool image); an attack that reconstructs the training set faithfully "
            "approaches this control, so a control above 0 can come from exact reconstructions of training images")


def victim_info(victim, train) -> dict[str, Any]:
    info = {k: victim.metrics.get(k) for k in ("train_accuracy", "test_accuracy", "final_loss", "stationarity_residual", "epochs")}
    info.update(arch=victim.arch, task=victim.task, loss=victim.loss, weight_decay=victim.weight_decay, data=train.spec)
    return info


def victim_failures(victim, train, equation: Equation | None = None) -> list[str]:
    """The assumptions of the attack's ``equation`` that fail for an exhume victim (its layers, and its stationarity
    as measured when it was trained); default: every check of the stationarity equation."""
    checks = checks_for(Stationarity() if equation is None else equation)
    failures = checks.layer_failures(victim.model, train.centred[:2].float())
    residual = victim.metrics.get("stationarity_residual")
    if residual is not None:
        failures += checks.residual_failures({"value": residual, "limit": checks.limit})
    return failures


def _write(result: EvalResult, candidates, train_x, pool, out: Path, figures: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result.save(out)
    if figures:
        plot_sorted_ssim(result, out / "ssim_sorted.png")
        if "margin" in result.arrays:
            plot_ssim_vs_margin(result, out / "ssim_vs_margin.png")
        pairs_grid(candidates, train_x, pool, result, out / "best_pairs.png", which="best")
        pairs_grid(candidates, train_x, pool, result, out / "worst_pairs.png", which="worst")
        candidates_grid(candidates, out / "candidates.png")
