"""``exhume audit``: its flags and the TOML config they override (both read :class:`~exhume.audit.config.AuditConfig`).

Config (``--config audit.toml``; every key is optional and a flag given on the command line wins;
relative paths are relative to the config file; one key per field of ``AuditConfig``)::

    model = "mymodel.py:Net"          # or "package.module:Net"
    weights = "net.safetensors"       # or a .pt/.pth state dict
    train = "train.npz"               # x (images) and y (labels); or an image folder, or IDX files
    unseen = "unseen.npz"             # images the model never saw (pool and control)
    normalize = "0.2860,0.3530"       # mean,std per channel (C means then C stds), or "none"
    loss = "logistic"                 # or "cross-entropy"
    weight_decay = 5e-4               # SGD/Adam weight_decay; 0 for none
    dp_epsilon = 8                    # trained with DP-SGD at this ε (optional; dp_delta, default 1e-5)
    max_seconds = 300
    out = "runs/audit"
    [model_args]                      # keyword arguments of the class
    hidden = 300
    [attack_args]                     # any parameter of the attack (exhume attack --method kkt --list-params)
    lr = 0.01
"""

from __future__ import annotations

import argparse
from pathlib import Path

from exhume.audit.config import DEFAULT_OUT, FILE_SETTINGS, SETTINGS, AuditConfig, add_flags, from_command, parse_normalize  # noqa: F401
from exhume.errors import DataError

KEYS = SETTINGS  # the TOML keys: the fields of AuditConfig
RECORDED = (*FILE_SETTINGS, "normalize")  # the settings metrics.json records as given


def add_parser(sub) -> None:
    p = sub.add_parser("audit", help="audit your own trained model: attack it, evaluate against your training images, give a verdict",
                       description="Reconstruct training images from your model's weights and judge the leak against images it never saw. "
                                   "Writes OUT/evaluation/metrics.json (verdict: leaks, no evidence or inconclusive, with its reason "
                                   "and p-value) and OUT/report.html. Exit 0 whatever the verdict; read it from metrics.json.")
    p.add_argument("--config", default=None, help="TOML file with any of the settings below (flags override it)")
    add_flags(p)
    p.add_argument("--force", action="store_true", help="replace an earlier audit's attack run in --out")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted audit's attack run in --out (same model, data and settings), then judge it")
    p.add_argument("--no-progress", action="store_true", help="hide progress output")


def settings(args: argparse.Namespace) -> AuditConfig:
    """The config file's settings with the command line's on top, validated."""
    return from_command(args, args.config)


def run(args: argparse.Namespace) -> int:
    import time

    from exhume.audit import audit, load_images, load_model_class, load_weights
    from exhume.deadline import Deadline
    from exhume.evaluation.cost import since_process_start

    started = time.time() - since_process_start()  # the budget counts the interpreter's start-up and the loading too
    cfg = settings(args)
    deadline = Deadline.after(cfg.max_seconds, since=started)
    model = load_weights(load_model_class(cfg.model, cfg.model_args), cfg.weights)
    x, y = load_images(cfg.train, need_labels=True)
    unseen, unseen_y = load_images(cfg.unseen, need_labels=False)  # labels, when given, score membership fairly
    if unseen.shape[1:] != x.shape[1:]:
        raise DataError(f"{cfg.unseen}: images of shape {unseen.shape[1:]}, but {cfg.train} holds {x.shape[1:]}; "
                        "the unseen images must be of the same kind and size as the training images")
    try:
        unseen_given = unseen if unseen_y is None else (unseen, unseen_y)
        result = audit(model, (x, y), unseen_given, config=cfg, progress=not args.no_progress, force=args.force, resume=args.resume,
                       settings=cfg.given(RECORDED), deadline=deadline)
    except DataError as e:  # about the training data and the model: name the file
        raise DataError(f"{cfg.train}: {e}") from None
    _print_verdict(result, Path(cfg.out))
    return 0


def _print_verdict(result, out: Path) -> None:
    m = result.metrics
    p = "n/a" if m.get("p_value") is None else f"{m['p_value']:.3g}"
    print(f"verdict: {result.verdict.upper()} (memorised {m.get('memorised')} / {m.get('n_train')}, control "
          f"{m.get('memorised_control')} / {m.get('control_size')} (oracle {m.get('memorised_control_oracle')}: the training images "
          f"themselves as candidates), one-sided Fisher p = {p}, alpha {m['alpha']})")
    print(f"reason: {result.reason}")
    if m.get("law"):
        print(law_line(m["law"]))
    if m.get("dp"):
        from exhume.audit.dp import dp_lines

        print(dp_lines(m["dp"]))
    print(f"metrics: {out / 'evaluation' / 'metrics.json'}   report: {out / 'report.html'}")


def law_line(law: dict) -> str:
    """The summary's line placing the model on the law of data reconstruction (:mod:`exhume.audit.law`)."""
    line = (f"law: p = {law['p']:,} trained parameters, d = {law['d']:,}, n = {law['n']:,}, p/(d·n) = {law['p_over_dn']:.3g}: "
            f"{law['regime']}")
    measured = law.get("measured")
    return line if not isinstance(measured, dict) else f"{line}\nlaw, measured: {measured.get('reading')}"
