"""``exhume audit``: its flags, the TOML config they override, and the call to :func:`exhume.audit.audit`.

Config (``--config audit.toml``; every key is optional and a flag given on the command line wins;
relative paths are relative to the config file)::

    model = "mymodel.py:Net"          # or "package.module:Net"
    weights = "net.safetensors"       # or a .pt/.pth state dict
    train = "train.npz"               # x (images) and y (labels); or an image folder, or IDX files
    unseen = "unseen.npz"             # images the model never saw (pool and control)
    normalize = "0.2860,0.3530"       # mean,std per channel (C means then C stds), or "none"
    loss = "logistic"                 # or "cross-entropy"
    weight_decay = 5e-4               # SGD/Adam weight_decay; 0 for none
    max_seconds = 300
    out = "runs/audit"
    [model_args]                      # keyword arguments of the class
    hidden = 300
    [attack_args]                     # any parameter of the attack (exhume attack --method kkt --list-params)
    lr = 0.01
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from exhume.errors import ConfigError, DataError

KEYS = ("model", "model_args", "weights", "train", "unseen", "normalize", "task", "loss", "weight_decay", "positive_class",
        "max_seconds", "out", "seed", "device", "method", "attack_args", "alpha")
PATH_KEYS = ("weights", "train", "unseen", "out")


def add_parser(sub) -> None:
    p = sub.add_parser("audit", help="audit your own trained model: attack it, evaluate against your training images, give a verdict",
                       description="Reconstruct training images from your model's weights and judge the leak against images it never saw. "
                                   "Writes OUT/evaluation/metrics.json (verdict: leaks, no evidence or inconclusive, with its reason "
                                   "and p-value) and OUT/report.html. Exit 0 whatever the verdict; read it from metrics.json.")
    p.add_argument("--config", default=None, help="TOML file with any of the settings below (flags override it)")
    p.add_argument("--model", default=None, help="the model class: path/to/file.py:ClassName or package.module:ClassName")
    p.add_argument("--model-args", default=None, help="JSON object of the class's constructor arguments, e.g. '{\"hidden\": 300}'")
    p.add_argument("--weights", default=None, help="trained weights: .safetensors, or a .pt/.pth state dict (never a pickled model)")
    p.add_argument("--train", default=None, help="the training images: .npz with x and y, a folder with one subfolder per class, or IDX files")
    p.add_argument("--unseen", default=None, help="images of the same kind the model never saw (pool and control), same formats")
    p.add_argument("--normalize", default=None, metavar="MEAN,STD",
                   help="input normalisation used in training, (x - mean) / std on [0, 1] pixels: one mean and one std per "
                        "channel (C means, then C stds), or 'none' for raw [0, 1] pixels; required")
    p.add_argument("--task", default=None, choices=("binary", "multiclass"), help="checked against the model's outputs (1 or 2 logits: binary)")
    p.add_argument("--loss", default=None, help="training loss: logistic (BCE-with-logits, one logit) or cross-entropy; required")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="L2 weight decay w of mean loss + (w/2)|theta|^2, i.e. torch.optim.SGD's weight_decay; 0 for none; required")
    p.add_argument("--positive-class", type=int, default=None,
                   help="binary: the label counted as +1 (default: the larger label with one logit, class 1 with two logits)")
    p.add_argument("--max-seconds", type=float, default=None, help="attack budget in seconds (default 300)")
    p.add_argument("--method", default=None, help="attack name (default kkt)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="an attack parameter, e.g. -p lr=0.02")
    p.add_argument("--alpha", type=float, default=None, help="significance level of the one-sided Fisher test (default 0.05)")
    p.add_argument("-o", "--out", default=None, help="folder to write (default runs/audit)")
    p.add_argument("--force", action="store_true", help="replace an earlier audit's attack run in --out")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted audit's attack run in --out (same model, data and settings), then judge it")
    p.add_argument("--seed", type=int, default=None,
                   help="attack seed (default 0); the unseen images are split into pool and control with seed 1, as in exhume evaluate")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide progress output")


def _read_config(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    cfg_path = Path(path)
    if not cfg_path.is_file():
        raise ConfigError(f"config file {cfg_path} does not exist")
    try:
        cfg = tomllib.loads(cfg_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {cfg_path} is not valid TOML ({e})") from None
    unknown = sorted(set(cfg) - set(KEYS))
    if unknown:
        raise ConfigError(f"config file {cfg_path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    for key in PATH_KEYS:
        if isinstance(cfg.get(key), str):
            cfg[key] = str(cfg_path.parent / cfg[key])
    if isinstance(cfg.get("model"), str) and ".py:" in cfg["model"]:
        cfg["model"] = str(cfg_path.parent / cfg["model"])
    return cfg


def parse_normalize(value: Any):
    """``"none"``, ``"m,s"`` / ``"m1,m2,m3,s1,s2,s3"``, a list of 2C numbers, or a table ``{mean, std}``."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return value
    if isinstance(value, dict):
        if set(value) != {"mean", "std"}:
            raise ConfigError(f"normalize table needs exactly 'mean' and 'std', got {sorted(value)}")
        return value["mean"], value["std"]
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        nums = [float(v) for v in items]
    except (TypeError, ValueError):
        raise ConfigError(f"--normalize {value!r}: expected MEAN,STD numbers (C means then C stds) or 'none'") from None
    if len(nums) % 2 or not nums:
        raise ConfigError(f"--normalize {value!r}: expected an even count, C means then C stds (e.g. 0.1307,0.3081)")
    if not all(math.isfinite(v) for v in nums):
        raise ConfigError(f"--normalize {value!r}: expected finite numbers, C means then C stds (e.g. 0.1307,0.3081)")
    half = len(nums) // 2
    return nums[:half], nums[half:]


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The config file's settings with the command line's on top."""
    from exhume.params import parse_params

    cfg = _read_config(args.config)
    for key in KEYS:
        value = getattr(args, key, None)
        if key == "model_args" and value is not None:
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--model-args is not valid JSON ({e}); expected e.g. '{{\"hidden\": 300}}'") from None
        if value is not None:
            cfg[key] = value
    if args.param:
        cfg["attack_args"] = {**cfg.get("attack_args", {}), **parse_params(args.param)}
    for key in ("model", "weights", "train", "unseen"):
        if not cfg.get(key):
            raise ConfigError(f"--{key} is not given (nor in --config); exhume audit needs --model, --weights, --train and --unseen")
    if cfg.get("model_args") is not None and not isinstance(cfg["model_args"], dict):
        raise ConfigError("model_args must be a JSON object / TOML table of keyword arguments")
    return cfg


def run(args: argparse.Namespace) -> int:
    from exhume.audit import load_images, load_model_class, load_weights

    cfg = settings(args)
    model = load_weights(load_model_class(cfg["model"], cfg.get("model_args")), cfg["weights"])
    x, y = load_images(cfg["train"], need_labels=True)
    unseen, _ = load_images(cfg["unseen"], need_labels=False)
    if unseen.shape[1:] != x.shape[1:]:
        raise DataError(f"{cfg['unseen']}: images of shape {unseen.shape[1:]}, but {cfg['train']} holds {x.shape[1:]}; "
                        "the unseen images must be of the same kind and size as the training images")
    out = Path(cfg.get("out") or "runs/audit")
    try:
        result = _audit(model, x, y, unseen, cfg, out, progress=not args.no_progress, force=args.force, resume=args.resume)
    except DataError as e:  # about the training data and the model: name the file
        raise DataError(f"{cfg['train']}: {e}") from None
    m = result.metrics
    p = "n/a" if m.get("p_value") is None else f"{m['p_value']:.3g}"
    print(f"verdict: {result.verdict.upper()} (memorised {m.get('memorised')} / {m.get('n_train')}, control "
          f"{m.get('memorised_control')} / {m.get('control_size')} (oracle {m.get('memorised_control_oracle')}: the training images "
          f"themselves as candidates), one-sided Fisher p = {p}, alpha {m['alpha']})")
    print(f"reason: {result.reason}")
    print(f"metrics: {out / 'evaluation' / 'metrics.json'}   report: {out / 'report.html'}")
    return 0


def _given(cfg: dict[str, Any], key: str, default):
    """``cfg[key]`` when given (0 included: a value the checks then judge), else ``default``."""
    value = cfg.get(key)
    return default if value is None else value


def _audit(model, x, y, unseen, cfg: dict[str, Any], out: Path, progress: bool, force: bool = False, resume: bool = False):
    from exhume.audit import audit
    from exhume.device import check_device

    return audit(model, (x, y), unseen, loss=cfg.get("loss"), weight_decay=cfg.get("weight_decay"),
                 normalize=parse_normalize(cfg.get("normalize")), task=cfg.get("task"), positive_class=cfg.get("positive_class"),
                 max_seconds=_given(cfg, "max_seconds", 300.0), method=_given(cfg, "method", "kkt"),
                 attack_args=cfg.get("attack_args"), alpha=_given(cfg, "alpha", 0.05), out=out, seed=int(_given(cfg, "seed", 0)),
                 device=check_device(_given(cfg, "device", "cpu")), progress=progress, force=force, resume=resume,
                 settings={k: v for k, v in cfg.items() if k in ("model", "model_args", "weights", "train", "unseen", "normalize")})
