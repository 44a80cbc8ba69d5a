"""The audit's settings: one dataclass that the TOML file, the flags of ``exhume audit`` and ``exhume.audit`` read.

A setting is one field of :class:`AuditConfig`, declared with :func:`setting`: its default, and
beside it the help of its flag (``--name-with-dashes``, generated), the flag's type, and whether a
TOML value is a path relative to the config file. Validated once, when the config is made: a bad
or missing value stops there with one line naming the setting. The file settings (``model``,
``model_args``, ``weights``, ``train``, ``unseen``) are the command's; ``exhume.audit`` takes the
model and the arrays themselves.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from exhume.attacks import DEFAULT_METHOD
from exhume.errors import ConfigError
from exhume.files.fields import check_setting
from exhume.losses import CLASSIFIER_LOSSES, LOSS_ALIASES

LOSS_NAMES = {**{name: name for name in CLASSIFIER_LOSSES}, **LOSS_ALIASES}  # the losses an audit takes, by any of their names
DEFAULT_OUT = "runs/audit"


def setting(default: Any = None, help: str = "", *, flags: tuple[str, ...] = (), path: bool = False, file: bool = False,
            **argparse_kwargs: Any):
    """A field of :class:`AuditConfig`: its default, its flag (``flags``, default ``--name``; ``argparse_kwargs``
    such as ``type``, ``choices``, ``metavar``), ``path``: a TOML value is relative to the config file,
    ``file``: a setting of the command only (``exhume.audit`` takes the object itself)."""
    meta = {"help": help, "flags": flags, "path": path, "file": file, "argparse": argparse_kwargs}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def _relative_model(value: Any, base: Path) -> Any:
    return str(base / value) if isinstance(value, str) and ".py:" in value else value


@dataclass(frozen=True)
class AuditConfig:
    """Every setting of an audit (see the module docstring); ``AuditConfig(**settings)`` validates them."""

    model: str | None = setting(None, "the model class: path/to/file.py:ClassName or package.module:ClassName", file=True)
    model_args: dict[str, Any] | None = setting(None, "JSON object of the class's constructor arguments, e.g. '{\"hidden\": 300}'",
                                                file=True)
    weights: str | None = setting(None, "trained weights: .safetensors, or a .pt/.pth state dict (never a pickled model)",
                                  path=True, file=True)
    train: str | None = setting(None, "the training images: .npz with x and y, a folder with one subfolder per class, or IDX files",
                                path=True, file=True)
    unseen: str | None = setting(None, "images of the same kind the model never saw (pool and control), same formats",
                                 path=True, file=True)
    normalize: Any = setting(None, "input normalisation used in training, (x - mean) / std on [0, 1] pixels: one mean and one "
                             "std per channel (C means, then C stds), or 'none' for raw [0, 1] pixels; required", metavar="MEAN,STD")
    task: str | None = setting(None, "checked against the model's outputs (1 or 2 logits: binary)", choices=("binary", "multiclass"))
    loss: str | None = setting(None, "training loss: logistic (BCE-with-logits, one logit) or cross-entropy; required")
    weight_decay: float | None = setting(None, "L2 weight decay w of mean loss + (w/2)|theta|^2, i.e. torch.optim.SGD's "
                                         "weight_decay; 0 for none; required", type=float)
    positive_class: int | None = setting(None, "binary: the label counted as +1 (default: the larger label with one logit, "
                                         "class 1 with two logits)", type=int)
    max_seconds: float = setting(300.0, "the whole audit's budget in seconds of wall time (default 300): the checks and the "
                                 "membership exposure first, then the attack, with the judging's measured estimate kept aside "
                                 "for after it", type=float)
    method: str = setting(DEFAULT_METHOD, f"attack name (default {DEFAULT_METHOD})")
    attack_args: dict[str, Any] = setting({}, "an attack parameter, e.g. -p lr=0.02", flags=("-p", "--param"), action="append",
                                          metavar="KEY=VALUE")
    alpha: float = setting(0.05, "significance level of the one-sided Fisher test (default 0.05)", type=float)
    out: str | None = setting(None, f"folder to write (default {DEFAULT_OUT})", flags=("-o", "--out"), path=True)
    seed: int = setting(0, "attack seed (default 0); the unseen images are split into pool and control with seed 1, as in "
                        "exhume evaluate", type=int)
    device: str = setting("cpu", "torch device, e.g. cpu or cuda (default cpu)")
    start: Any = setting(None, "the known-start threat model: the weights training started from (the public checkpoint a model "
                         "was fine-tuned from, or the owner's initial weights): .safetensors or a .pt/.pth state dict (never "
                         "a pickled model); in Python also a dict of tensors", flags=("--start-weights",), path=True, metavar="FILE")
    start_partial: bool = setting(False, "the start covers only some parameters (e.g. a public backbone without the new head)",
                                  action="store_true")
    training: dict[str, Any] = setting({}, "how training ran from the start, as far as it is known (optional): a JSON object / "
                                       "TOML table with optimizer (sgd, adam, adamw), lr, momentum, betas, weight_decay, steps "
                                       "or epochs and batch_size; the exact run (--method simulate) also needs sampler (random, "
                                       "sequential) and seed, and takes nesterov, eps, drop_last", metavar="JSON")
    optimizer_state: str | None = setting(None, "Adam's final state: tensors exp_avg_sq.<parameter> (+ step), or "
                                          "torch.save(optimizer.state_dict()); with --start-weights", path=True, metavar="FILE")
    dp_epsilon: float | None = setting(None, "the model was trained with differential privacy (DP-SGD) at this ε: the summary "
                                       "and the report state it, exhume's measured reading at that ε and what the verdict means "
                                       "there", type=float, metavar="EPSILON")
    dp_delta: float | None = setting(None, "its δ (default 1e-5); with --dp-epsilon", type=float, metavar="DELTA")

    def __post_init__(self) -> None:
        for name, value in _validated(self).items():
            object.__setattr__(self, name, value)

    def given(self, names) -> dict[str, Any]:
        """The settings among ``names`` that were given (not None), as given."""
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def mean_std(self):
        """The normalisation as ``(mean, std)`` (scalars, per channel or images), or ``"none"``."""
        value = self.normalize
        if isinstance(value, (str, dict)) or (isinstance(value, (list, tuple)) and all(_number(v) for v in value)):
            return parse_normalize(value)
        return tuple(value)


def _number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _validated(cfg: AuditConfig) -> dict[str, Any]:
    """The settings that validation normalises (the loss's name, numbers as numbers); raises one line per defect."""
    from exhume.attacks import attack_class
    from exhume.device import check_device
    from exhume.evaluation.verdict import check_alpha

    out: dict[str, Any] = {"loss": _loss(cfg.loss), "weight_decay": _weight_decay(cfg.weight_decay)}
    _normalize(cfg.normalize)
    out["alpha"] = check_alpha(cfg.alpha)
    out["max_seconds"] = _positive_seconds(cfg.max_seconds)
    if cfg.task is not None and cfg.task not in ("binary", "multiclass"):
        raise ConfigError(f"task must be 'binary' or 'multiclass' (or left out: read from the model's outputs), got {cfg.task!r}")
    out["positive_class"] = check_setting("positive_class", cfg.positive_class, integer=True, optional=True)
    out["seed"] = check_setting("seed", cfg.seed, integer=True)
    attack_class(cfg.method)  # an unknown attack: one line naming the known ones
    if not isinstance(cfg.attack_args, dict):
        raise ConfigError(f"attack_args must be a TOML table / dict of attack parameters, got {cfg.attack_args!r}")
    if cfg.model_args is not None and not isinstance(cfg.model_args, dict):
        raise ConfigError("model_args must be a JSON object / TOML table of keyword arguments")
    out["device"] = check_device(cfg.device)
    out.update(_start_settings(cfg))
    out.update(_dp_settings(cfg))
    return out


def _dp_settings(cfg: AuditConfig) -> dict[str, Any]:
    """The DP budget stated: ε finite and > 0, δ in (0, 1) (default 1e-5), δ only with ε."""
    if cfg.dp_epsilon is None:
        if cfg.dp_delta is not None:
            raise ConfigError("dp_delta is the δ of a DP budget: give dp_epsilon (--dp-epsilon) too")
        return {}
    epsilon = check_setting("dp_epsilon", _numeric(cfg.dp_epsilon), positive=True)
    delta = check_setting("dp_delta", _numeric(1e-5 if cfg.dp_delta is None else cfg.dp_delta), positive=True, high=1.0)
    if delta >= 1.0:
        raise ConfigError(f"dp_delta: expected a number < 1, got {delta}")
    return {"dp_epsilon": epsilon, "dp_delta": delta}


def _start_settings(cfg: AuditConfig) -> dict[str, Any]:
    """The known-start settings checked (the start's tensors are checked against the model when the audit runs)."""
    from exhume.attacks import check_uses_start
    from exhume.victim.start import training_settings

    if cfg.start is not None and not isinstance(cfg.start, (str, Path, dict)):
        raise ConfigError(f"start must be a weights file or a dict of parameter names to tensors, got {type(cfg.start).__name__}")
    training = {} if cfg.training is None else cfg.training
    if not isinstance(training, dict):
        raise ConfigError(f"training must be a TOML table / JSON object of training settings, got {training!r}")
    if cfg.start is None and (training or cfg.optimizer_state is not None or cfg.start_partial):
        raise ConfigError("training, optimizer_state and start_partial describe training from a start: give the starting weights "
                          "too (start, --start-weights FILE)")
    training_settings(dict(training) or None)  # unknown keys, non-finite or out-of-range values: one line naming the setting
    if cfg.start is not None:
        check_uses_start(cfg.method)
    return {"training": dict(training), "start_partial": bool(cfg.start_partial)}


def _loss(loss: Any) -> str:
    if loss is None:
        raise ConfigError("loss is not given: state the training loss, 'logistic' (BCE-with-logits) or 'cross-entropy'")
    if str(loss).lower() not in LOSS_NAMES:
        raise ConfigError(f"unknown loss {loss!r}; expected one of {', '.join(LOSS_NAMES)}")
    return LOSS_NAMES[str(loss).lower()]


def _weight_decay(value: Any) -> float:
    if value is None:
        raise ConfigError("weight_decay is not given: state the L2 weight decay the model was trained with "
                          "(the weight_decay of torch.optim.SGD/Adam; 0 for none); it changes the attack's equation")
    return check_setting("weight_decay", _numeric(value), low=0.0)  # the files' field checks: finite, in range


def _positive_seconds(value: Any) -> float:
    return check_setting("max_seconds (the audit's budget in seconds)", _numeric(value), positive=True)


def _numeric(value: Any) -> Any:
    """A string of a number read as that number (the audit always read them); anything else as given."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _normalize(value: Any) -> None:
    if value is None:
        raise ConfigError("normalize is not given: state the input normalisation the model was trained with, e.g. "
                          "--normalize 0.1307,0.3081 (mean, std per channel) or normalize=(mean, std), or 'none' "
                          "if the model takes raw [0, 1] pixels")
    if isinstance(value, (str, dict)) or (isinstance(value, (list, tuple)) and value and all(_number(v) for v in value)):
        parse_normalize(value)  # one line for a malformed text, table or list of numbers
    elif not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ConfigError(f"normalize must be (mean, std) or 'none', got {value!r}")


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


# -- the command's side: flags generated from the fields, the TOML file, and the two merged ---------------------

SETTINGS = tuple(f.name for f in fields(AuditConfig))
FILE_SETTINGS = tuple(f.name for f in fields(AuditConfig) if f.metadata["file"])


def add_flags(p) -> None:
    """One flag per setting of :class:`AuditConfig`, each defaulting to None (not given: the config file's value or the field's)."""
    for f in fields(AuditConfig):
        meta = f.metadata
        flags = meta["flags"] or (f"--{f.name.replace('_', '-')}",)
        p.add_argument(*flags, dest=f.name, default=None, help=meta["help"], **meta["argparse"])


def read_toml(path: str | Path) -> dict[str, Any]:
    """The settings of a TOML config file; its relative paths made relative to the file's folder."""
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
    unknown = sorted(set(cfg) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"config file {cfg_path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    for f in fields(AuditConfig):
        if f.metadata["path"] and isinstance(cfg.get(f.name), str):
            cfg[f.name] = str(cfg_path.parent / cfg[f.name])
    if "model" in cfg:
        cfg["model"] = _relative_model(cfg["model"], cfg_path.parent)
    return cfg


def from_command(args, config_file: str | None = None) -> AuditConfig:
    """The config of ``exhume audit``: the TOML file's settings with the flags given on top, validated."""
    from exhume.params import parse_params

    cfg = read_toml(config_file) if config_file is not None else {}
    for name in SETTINGS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name in ("model_args", "training"):
            value = _json_object(value, f"--{name.replace('_', '-')}")
        if name == "attack_args":  # -p KEY=VALUE, each over the file's table
            value = {**cfg.get("attack_args", {}), **parse_params(value)} if value else None
            if value is None:
                continue
        cfg[name] = value
    for key in ("model", "weights", "train", "unseen"):
        if not cfg.get(key):
            raise ConfigError(f"--{key} is not given (nor in --config); exhume audit needs --model, --weights, --train and --unseen")
    return AuditConfig(**{"out": DEFAULT_OUT, **cfg})


def _json_object(text: str, flag: str = "--model-args") -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        example = '{"optimizer": "sgd", "lr": 0.01, "epochs": 50, "batch_size": 64}' if flag == "--training" else '{"hidden": 300}'
        raise ConfigError(f"{flag} is not valid JSON ({e}); expected e.g. '{example}'") from None


def from_options(config: AuditConfig | None = None, **options: Any) -> AuditConfig:
    """The config of ``exhume.audit(...)``: ``config`` (default: the defaults) with ``options`` on top, validated once."""
    unknown = sorted(set(options) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"audit() has no setting {', '.join(unknown)}; known: {', '.join(s for s in SETTINGS if s not in FILE_SETTINGS)}")
    files = sorted(k for k in options if k in FILE_SETTINGS and options[k] is not None)
    if files:
        raise ConfigError(f"{', '.join(files)}: a file setting of 'exhume audit'; exhume.audit(model, train, unseen) takes "
                          "the model and the arrays themselves")
    options = {k: ({} if v is None else v) if k in ("attack_args", "training") else v for k, v in options.items()}
    if config is None:
        return AuditConfig(**options)
    return replace(config, **options) if options else config
