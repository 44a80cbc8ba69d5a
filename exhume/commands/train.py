"""``exhume train``: its flags, the training (and differential privacy) configs they make, and the command.

Beside :mod:`exhume.audit.command`; :mod:`exhume.cli` adds the parser and dispatches to :func:`run`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from exhume.choices import DTYPE_NAMES, FULL_BATCH_OPTIMIZERS
from exhume.errors import ConfigError


def add_parser(sub, common) -> None:
    """``exhume train``'s flags (``common``: the flags every command shares, :mod:`exhume.cli`'s)."""
    from exhume.victim.recipe import PAPER_ARCH, PAPER_ARCH_FULL, PAPER_TRAIN

    p = sub.add_parser("train", help="train a victim and save it as a folder")
    common(p)
    p.add_argument("--data", default="mnist", help="mnist (bundled), fashion-mnist, cifar10, digits, folder")
    p.add_argument("--root", default=None, help="dataset location (IDX folder, CIFAR archive, image folder)")
    p.add_argument("--task", default="odd-even", help="odd-even, vehicles-animals, a split like 1,3,5/0,2,4, multiclass, or regression (class id on [-1, 1])")
    p.add_argument("-n", type=int, default=100, help="training-set size, balanced over the two labels")
    p.add_argument("--arch", default=PAPER_ARCH, help=f"default: the paper victim at CPU scale; e.g. {PAPER_ARCH_FULL}")
    p.add_argument("--loss", default="auto", help="logistic, cross-entropy or squared (auto: by task)")
    p.add_argument("--optimizer", default=PAPER_TRAIN["optimizer"], choices=FULL_BATCH_OPTIMIZERS,
                   help=f"full-batch gradient descent or Adam (default {PAPER_TRAIN['optimizer']})")
    p.add_argument("--lr", type=float, default=PAPER_TRAIN["lr"], help=f"learning rate (default {PAPER_TRAIN['lr']})")
    p.add_argument("--wd", type=float, default=PAPER_TRAIN["weight_decay"], help="weight decay w in mean loss + w/2 |theta|^2 (0 for none)")
    p.add_argument("--epochs", type=int, default=None, help="maximum epochs (default 1,000,000, stopped by --seconds; with "
                   "--batch-size 10; with --dp-epsilon required: the steps the accountant plans for)")
    p.add_argument("--seconds", type=float, default=None, help="maximum training time (default 60; none with a --*-threshold, "
                   "which or --epochs stops training; with differential privacy none: the planned epochs run)")
    p.add_argument("--loss-threshold", type=float, default=None, help="stop once the training loss is below this")
    p.add_argument("--residual-threshold", type=float, default=None,
                   help="stop once the relative stationarity residual is below this (with weight decay)")
    p.add_argument("--span-threshold", type=float, default=None,
                   help="stop once every weight layer that sees more than n directions has σ_{n+1}/σ_1 below this: its "
                        "spectrum collapsed to the training inputs' span (e.g. 1e-4 for a CNN near a stationary point)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32", help="training precision (default float32)")
    p.add_argument("--batch-size", type=int, default=None, help="mini-batch training (SGD with --optimizer gd, else Adam) "
                   "instead of full batch; with differential privacy the expected (Poisson) batch")
    p.add_argument("--momentum", type=float, default=None, help="SGD's momentum with --batch-size (default 0.9)")
    p.add_argument("--keep-start", action="store_true", help="keep the weights training started from (start.safetensors), "
                   "for the known-start threat model (always kept with differential privacy)")
    p.add_argument("--force", action="store_true", help="replace a victim (or a run) already in --out")
    add_dp_arguments(p)


def add_dp_arguments(p: argparse.ArgumentParser) -> None:
    """``exhume train``'s differential privacy: DP-SGD through Opacus (exhume.victim.private)."""
    from exhume.victim.private import ACCOUNTANTS

    g = p.add_argument_group("differential privacy", 'DP-SGD through Opacus (pip install "exhume[dp]"): Poisson sampling, '
                             "per-sample clipping, Gaussian noise; the victim records its privacy and keeps its start")
    g.add_argument("--dp-epsilon", type=float, default=None, help="target ε: Opacus's accountant solves the noise multiplier "
                   "for it over the planned --epochs")
    g.add_argument("--dp-delta", type=float, default=None, help="target δ (default 1e-5)")
    g.add_argument("--dp-noise-multiplier", type=float, default=None, help="the noise multiplier itself instead of "
                   "--dp-epsilon; 0 clips without noise (not private: the control for clipping's own effect)")
    g.add_argument("--max-grad-norm", type=float, default=None, help="the per-sample clipping norm C (default 1.0)")
    g.add_argument("--dp-accountant", default=None, choices=ACCOUNTANTS, help="Opacus's accountant (default rdp; gdp, a "
                   "central-limit approximation, is refused at sampling rate 1)")
    g.add_argument("--dp-secure-mode", action="store_true", help="Opacus's secure mode: the noise and the sampling from a "
                   "cryptographically secure generator (needs torchcsprng built for your torch)")
    g.add_argument("--dp-noise-seed", type=int, default=None, help="seed the sampling and the noise (recorded: whoever holds "
                   "the victim can replay them; for experiments, not private). Default: a secret seed, not recorded")


#: ``exhume train``'s time cap when neither --seconds nor a stopping threshold is given
DEFAULT_SECONDS = 60.0
THRESHOLD_FLAGS = {"loss_threshold": "--loss-threshold", "residual_threshold": "--residual-threshold",
                   "span_threshold": "--span-threshold"}


def thresholds_given(args: argparse.Namespace) -> bool:
    """Whether a stopping threshold was asked for: then no time cap is set unless --seconds gives one (the threshold, or
    --epochs, stops training; a default cap would stop the documented CNN recipe at a fifth of the epochs it needs)."""
    return any(getattr(args, k, None) is not None for k in THRESHOLD_FLAGS)


def plan_text(cfg) -> str | None:
    """The line printed before full-batch training with a threshold: what will stop it (None without a threshold)."""
    given = [f"{flag} {getattr(cfg, k):g}" for k, flag in THRESHOLD_FLAGS.items() if getattr(cfg, k, None) is not None]
    if not given:
        return None
    cap = "no time cap (--seconds sets one)" if cfg.max_seconds is None else f"at most {cfg.max_seconds:g} s (--seconds)"
    return f"training until {' or '.join(given)} is met, or {cfg.max_epochs:,} epochs (--epochs); {cap}"


#: each threshold's measure, short, for the printed line (the record names it in full)
SHORT_MEASURES = {"loss_threshold": "the training loss", "residual_threshold": "the stationarity residual",
                  "span_threshold": "σ_{n+1}/σ_1"}


def stop_text(stop: dict | None) -> str:
    """What stopped training, in words for the line ``exhume train`` prints (``stop``: the metrics' ``stop`` record of
    :func:`exhume.victim.train.stop_record`); a threshold the cap stopped short of is a warning with the value reached."""
    if not stop:
        return ""

    def value(k: str, t: dict, verb: str = "") -> str:
        return f"{SHORT_MEASURES[k]} not measured" if t["reached"] is None else f"{SHORT_MEASURES[k]} {verb}{t['reached']:.3g}"

    reason, thresholds = stop["reason"], stop["thresholds"]
    if reason in THRESHOLD_FLAGS:
        return f"; stopped by {THRESHOLD_FLAGS[reason]} {thresholds[reason]['threshold']:g} ({value(reason, thresholds[reason])})"
    cap, flag = ((f"the time cap ({stop['max_seconds']:g} s)", "--seconds") if reason == "max_seconds"
                 else (f"the epoch cap ({stop['max_epochs']:,})", "--epochs"))
    unmet = [f"{THRESHOLD_FLAGS[k]} {t['threshold']:g} ({value(k, t, 'reached ')})" for k, t in thresholds.items() if not t["met"]]
    if not unmet:
        return f"; stopped by {cap}"
    return (f"; WARNING: {cap} stopped training before {' and '.join(unmet)} {'was' if len(unmet) == 1 else 'were'} met: "
            f"raise {flag} to train further")


def configs(args: argparse.Namespace):
    """``exhume train``'s training config (full batch, or mini-batch with --batch-size) and its DP config (or None)."""
    from exhume.data import DEFAULT_LOSS, task_kind
    from exhume.victim import MiniBatchConfig, TrainConfig
    from exhume.victim.private import DPConfig

    private = _check_dp_flags(args)
    if args.batch_size is not None and any(t is not None for t in (args.loss_threshold, args.residual_threshold, args.span_threshold)):
        raise ConfigError("--loss-threshold, --residual-threshold and --span-threshold stop full-batch training; mini-batch "
                          "training runs --epochs")
    if args.momentum is not None and args.batch_size is None:
        raise ConfigError("--momentum is SGD's with mini-batches: give --batch-size too (full-batch gradient descent has none)")
    loss = DEFAULT_LOSS[task_kind(args.task)] if args.loss == "auto" else args.loss
    seconds = args.seconds if args.seconds is not None or private or thresholds_given(args) else DEFAULT_SECONDS
    if args.batch_size is not None:
        cfg = MiniBatchConfig(loss=loss, optimizer="sgd" if args.optimizer == "gd" else "adam", lr=args.lr, batch_size=args.batch_size,
                              momentum=0.9 if args.momentum is None else args.momentum, epochs=args.epochs or 10,
                              weight_decay=args.wd, max_seconds=seconds)
    else:
        cfg = TrainConfig(loss=loss, optimizer=args.optimizer, lr=args.lr, weight_decay=args.wd, max_epochs=args.epochs or 1_000_000,
                          max_seconds=seconds, loss_threshold=args.loss_threshold, residual_threshold=args.residual_threshold,
                          span_threshold=args.span_threshold)
    dp = DPConfig(epsilon=args.dp_epsilon, noise_multiplier=args.dp_noise_multiplier, secure_mode=args.dp_secure_mode,
                  noise_seed=args.dp_noise_seed,
                  **{k: v for k, v in (("delta", args.dp_delta), ("max_grad_norm", args.max_grad_norm),
                                       ("accountant", args.dp_accountant)) if v is not None}) if private else None
    return cfg, dp


def _check_dp_flags(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask for differentially private training; a flag that needs it without it, or that private
    training cannot honour, is one line."""
    given = {k: getattr(args, k) for k in ("dp_epsilon", "dp_noise_multiplier", "dp_delta", "max_grad_norm", "dp_accountant",
                                           "dp_noise_seed")}
    given["dp_secure_mode"] = args.dp_secure_mode or None
    private = given["dp_epsilon"] is not None or given["dp_noise_multiplier"] is not None
    if not private and any(v is not None for v in given.values()):
        raise ConfigError("--dp-delta, --max-grad-norm, --dp-accountant, --dp-secure-mode and --dp-noise-seed set differentially "
                          "private training: give --dp-epsilon (or --dp-noise-multiplier) too")
    if not private:
        return False
    if args.epochs is None:
        raise ConfigError("differentially private training needs --epochs: the accountant solves the noise for the steps planned")
    stops = [f"--{k.replace('_', '-')}" for k in ("loss_threshold", "residual_threshold", "span_threshold") if getattr(args, k) is not None]
    if stops:
        raise ConfigError(f"{', '.join(stops)} would stop training on what it reads of the model; differentially private "
                          "training runs its planned --epochs (the accountant's ε is theirs): leave it out")
    return True


def start_decay(cfg, metrics: dict, n: int, private: bool) -> float | None:
    """``c``, the start's share that weight decay left in the trained weights, for the training just run (None: not one
    number, Adam's per-weight steps, or differentially private training; the layer report then fits it per layer):
    gradient descent's ``(1 − η·w)^T`` and mini-batch SGD's with momentum, as the owner's stated settings give it
    (:meth:`exhume.victim.start.TrainingSettings.decay`)."""
    from exhume.victim import MiniBatchConfig
    from exhume.victim.start import TrainingSettings

    if private or cfg.optimizer == "adam":  # gradient descent (full batch) or SGD (mini-batch) else
        return None
    if isinstance(cfg, MiniBatchConfig):  # one step per batch of two or more (a lone last sample is skipped)
        steps = metrics["epochs"] * (-(-n // cfg.batch_size) - (n % cfg.batch_size == 1 and n >= 2))
        momentum = cfg.momentum
    else:
        steps, momentum = metrics["epochs"], 0.0
    return TrainingSettings(optimizer="sgd", lr=cfg.lr, momentum=momentum, weight_decay=cfg.weight_decay, steps=steps).decay(n)


def run(args: argparse.Namespace) -> int:
    """Train, save, and print the victim, its privacy and where its weights show the span."""
    import torch

    from exhume.evaluation.layers import layer_diagnostics, layers_text
    from exhume.victim import make_victim

    cfg, private = configs(args)
    plan = plan_text(cfg)
    if plan is not None:
        print(plan, flush=True)
    from exhume.device import check_device
    from exhume.files.runfolder import RUN_FILES, own_run_folder
    from exhume.victim.victim import VICTIM_FILES

    # locked while training and saving, as an attack's folder; a victim (or a run) already there is replaced only with
    # --force: the attack runs written for it would be orphaned
    with own_run_folder(args.out, force=args.force, run_files=(*VICTIM_FILES, *RUN_FILES, "restarts"), holds="a victim or a run",
                        can_resume=False):
        victim = make_victim(args.data, args.task, args.n, args.arch, cfg, seed=args.seed, root=args.root,
                             progress=not args.no_progress, dtype=getattr(torch, args.dtype), device=check_device(args.device),
                             private=private, keep_start=True)  # the start, known to whoever trained: Δ's spectra
        start, victim.start = victim.start, victim.start if args.keep_start or private is not None else None
        victim.metrics["layers"] = layer_diagnostics(victim.model, victim.train_set.centred.float(), args.n, start=start,
                                                     decay=start_decay(cfg, victim.metrics, args.n, private is not None))
        victim.save(args.out)
    m = victim.metrics
    print(f"victim saved to {args.out}: train accuracy {m['train_accuracy']:.3f}, test accuracy {m.get('test_accuracy', float('nan')):.3f}, "
          f"final loss {m['final_loss']:.4g}, relative stationarity residual {m['stationarity_residual']}, {m['epochs']} epochs in {m['seconds']} s"
          f"{stop_text(m.get('stop'))}")
    dp = victim.privacy
    if dp is not None:
        spent = "∞ (no noise: not private)" if dp["epsilon_spent"] is None else f"{dp['epsilon_spent']:.4g}"
        print(f"privacy ({dp['library']}, {dp['accountant']} accountant): ε = {spent} at δ = {dp['delta']:g}, noise multiplier "
              f"{dp['noise_multiplier']:.4g}, clipping norm {dp['max_grad_norm']:g}, sampling rate {dp['sample_rate']:.4g}, "
              f"{dp['steps']} steps; start kept in {Path(args.out) / 'start.safetensors'}")
        print(f"privacy, randomness: {dp['randomness']}" + "".join(f"\nprivacy, accountant: {w}" for w in
                                                                     [dp.get("accountant_note"), *dp.get("accountant_warnings", [])] if w))
    print(layers_text(m["layers"]))
    return 0
