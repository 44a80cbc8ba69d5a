"""A head on a frozen feature extractor: is the extractor or the head's equation what stops the attack?

    python research/practitioner/oracle_features.py invert ZOO/mnist-frozen-head [--noise 0 0.1 0.3] [--steps 2000]
    python research/practitioner/oracle_features.py head ZOO/mnist-frozen-head [--seconds 60] [--steps 500]

With the start known, the parameters bit-equal to it (the frozen extractor) are left out of the
equation, and the trained head sees the images only through the extractor's output ``φ(x)``
(found here as the smallest submodule holding exactly the frozen parameters; :class:`HeadOf` runs
the model with that submodule's output replaced).

- ``invert`` (ORACLE: it reads the training images): the training images' **true** features, with
  relative Gaussian noise ``‖e‖ = noise·‖φ‖`` per image standing in for a recovery that is not
  exact, inverted by ``min_x ‖φ(x) − f‖² / ‖f‖²`` (Adam from the data mean, pixels in [0, 1]), and
  judged as an attack's candidates are (``exhume.evaluate``). Many memorised: the extractor is no
  obstacle.
- ``head``: the attack in feature space: kkt with the owner's known start (settings, Adam state) on
  the head alone, the candidates being features (no pixel prior, no background threshold), then the
  same inversion. Printed beside it (ORACLE): each training image's best relative feature error
  among the candidates, and the head's equation's residual at the true features against the
  attack's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (exhume, benchmarks), research/practitioner/

from exhume.errors import ConfigError  # noqa: E402
from exhume.starts import frozen_names  # noqa: E402


def find_extractor(model: nn.Module, start: dict[str, torch.Tensor] | None) -> str | None:
    """The smallest submodule holding every parameter that training left at its start, and nothing trained; None
    where no parameter is frozen, where the frozen ones are spread over the model, or the extractor is the whole model."""
    if not start:
        return None
    frozen = set(frozen_names(model, start))
    if not frozen:
        return None
    best = None
    for name, module in model.named_modules():
        if not name:
            continue
        own = {f"{name}.{k}" for k, _ in module.named_parameters()}
        if own and own <= frozen and frozen <= own and (best is None or len(name) > len(best)):
            best = name
    return best


class HeadOf(nn.Module):
    """``model`` as a function of its extractor's output: ``forward(f)`` runs ``model`` with submodule ``extractor``'s
    output replaced by ``f + centre`` (attacks feed centred inputs; the model's own input is a dummy of zeros).
    Parameters keep ``model``'s names under ``model.``."""

    def __init__(self, model: nn.Module, extractor: str, input_shape: tuple[int, ...], centre: torch.Tensor) -> None:
        super().__init__()
        self.model, self.extractor, self.input_shape = model, extractor, tuple(input_shape)
        self.centre = centre  # a plain attribute: neither a parameter nor a buffer of the head

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        handle = self.model.get_submodule(self.extractor).register_forward_hook(lambda mod, args, out: f + self.centre.to(f))
        try:
            return self.model(f.new_zeros((f.shape[0], *self.input_shape)))
        finally:
            handle.remove()


def features(model: nn.Module, extractor: str, x: torch.Tensor) -> torch.Tensor:
    """The extractor's output for inputs ``x`` (the whole forward runs; the output is caught on its way)."""
    caught: list[torch.Tensor] = []
    handle = model.get_submodule(extractor).register_forward_hook(lambda mod, args, out: caught.append(out))
    try:
        model(x)
    finally:
        handle.remove()
    if len(caught) != 1 or not isinstance(caught[0], torch.Tensor):
        raise ConfigError(f"extractor {extractor!r} must be called once per forward pass and return one tensor; "
                          f"it was called {len(caught)} times")
    return caught[0]


def head_view(view, extractor: str, centred: bool = False):
    """The attacker's view of the head: inputs are the extractor's features, raw (the default: the head's first layer
    then sees exactly the attack's unknowns, so the span of the training features is read from what training added to
    it) or, with ``centred``, centred on the features of the data mean (the model's inputs are centred images, so the
    data mean is the zero input)."""
    model = view.model
    zero = torch.zeros((1, *view.input_shape), dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        centre = features(model, extractor, zero)[0]
    if not centred:
        centre = torch.zeros_like(centre)
    head = HeadOf(model, extractor, tuple(view.input_shape), centre)
    with torch.no_grad():
        probe = head(features(model, extractor, zero) - centre)
        direct = model(zero)
    if not torch.allclose(probe, direct, rtol=1e-5, atol=1e-6):
        raise ConfigError(f"replacing extractor {extractor!r}'s output does not reproduce the model's output; "
                          "the forward pass must use that submodule's output alone")
    start = {f"model.{k}": v for k, v in view.start.items()}
    moment = None
    if view.training is not None and view.training.second_moment is not None:
        moment = {f"model.{k}": v for k, v in view.training.second_moment.items()}
    training = None if view.training is None else dataclasses.replace(view.training, second_moment=moment)
    return dataclasses.replace(view, model=head, input_shape=tuple(centre.shape), mean=centre, start=start, training=training)


def invert(model: nn.Module, extractor: str, target: torch.Tensor, mean: torch.Tensor, steps: int, lr: float = 0.01,
           seed: int = 0, stop=None) -> tuple[torch.Tensor, float]:
    """Display-space images in [0, 1] whose features match ``target`` (the model takes ``x − mean``; Adam from the data mean with 5 % noise,
    ``steps`` steps or until ``stop()``); with the mean relative feature error reached."""
    gen = torch.Generator().manual_seed(seed)
    dtype = target.dtype
    x = (mean.to(dtype) + 0.05 * torch.randn((len(target), *mean.shape), generator=gen, dtype=dtype)).clamp(0, 1)
    x.requires_grad_()
    opt = torch.optim.Adam([x], lr=lr)
    norm = target.flatten(1).norm(dim=1).clamp_min(1e-12)
    err = torch.ones(len(target))
    for _ in range(steps):
        opt.zero_grad()
        err = (features(model, extractor, x - mean) - target).flatten(1).norm(dim=1) / norm
        (err ** 2).sum().backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(0, 1)
        if stop is not None and stop():
            break
    return x.detach(), float(err.detach().mean())


def audited(folder: Path):
    """The victim as the owner's known-start audit sees it (``run.py``'s settings, the facade's view)."""
    from benchmarks.practitioner.run import audit_settings, known_start
    from exhume.audit import facade, load_images, load_model_class, load_weights
    from exhume.audit.command import parse_normalize
    from exhume.audit.config import AuditConfig

    cfg = audit_settings(folder / "audit.toml")
    extra = known_start(folder, json.loads((folder / "training.json").read_text()))
    model = load_weights(load_model_class(cfg.model, cfg.model_args), cfg.weights)
    x, y = load_images(cfg.train, need_labels=True)
    unseen, _ = load_images(cfg.unseen, need_labels=False)
    acfg = AuditConfig(loss=cfg.loss, weight_decay=cfg.weight_decay, normalize=parse_normalize(cfg.normalize), **extra)
    threat = facade._request(acfg, False, False)[0].threat  # the known start, attached once by the audit's request
    return facade._audited(model, (x, y), unseen, acfg, threat), x, y, unseen


def judge(images, labels, x, y, unseen) -> dict:
    import exhume
    from exhume.attacks.base import Reconstruction

    m = exhume.evaluate(Reconstruction("oracle", images, labels, None, {}, 0), train=(x, y), unseen=unseen, figures=False).metrics
    return {"memorised": m["memorised"], "control": m["memorised_control"], "one_to_one": m.get("one_to_one_ssim>=0.4"),
            "control_oracle": m.get("memorised_control_oracle"), "n": len(x)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("invert", "head"))
    ap.add_argument("victim")
    ap.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.1, 0.3])
    ap.add_argument("--steps", type=int, default=2000, help="inversion steps")
    ap.add_argument("--seconds", type=float, default=60.0, help="head: the feature-space attack's budget")
    ap.add_argument("--centred", action="store_true", help="head: features centred on the mean image's (no span then)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    data, x, y, unseen = audited(Path(args.victim))
    view = data.view
    ext = find_extractor(view.model, view.start)
    if ext is None:
        raise SystemExit(f"{args.victim}: no frozen extractor (no submodule holds exactly the parameters equal to the start)")
    with torch.no_grad():
        true = features(view.model, ext, data.centred)
    row = {"victim": Path(args.victim).name, "extractor": ext, "features": list(true.shape[1:]), "inversion_steps": args.steps}
    if args.mode == "invert":
        for noise in args.noise:
            e = torch.randn(true.shape, generator=torch.Generator().manual_seed(args.seed + 1))
            scale = true.flatten(1).norm(dim=1) / e.flatten(1).norm(dim=1)
            t0 = time.perf_counter()
            images, err = invert(view.model, ext, true + noise * e * scale.view(-1, *[1] * (true.dim() - 1)), view.mean,
                                 args.steps, seed=args.seed)
            print(json.dumps({**row, "feature_noise": noise, "feature_error": round(err, 4),
                              **judge(images, y, x, y, unseen), "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
        return 0
    from exhume.attacks import get_attack
    from exhume.attacks.trajectory import known_start_residual

    head = head_view(view, ext, args.centred)
    t0 = time.perf_counter()
    rec = get_attack("kkt", max_seconds=args.seconds, iterations=10**7, prior_weight=0.0, background=0.0).run(head, progress=False)
    found = rec.candidates.to(true.dtype)
    dist = torch.cdist(true.flatten(1), found.flatten(1)) / true.flatten(1).norm(dim=1, keepdim=True)
    images, err = invert(view.model, ext, found, view.mean, args.steps, seed=args.seed)
    truth = known_start_residual(head, (true - head.mean).to(torch.float32), data.y)["value"]
    print(json.dumps({**row, "attack_seconds": args.seconds, "iterations": rec.summary.get("iterations"),
                      "subspace": rec.config.get("subspace_used"), "subspace_rank": rec.config.get("subspace_rank"),
                      "subspace_reason": rec.config.get("subspace_reason"),
                      "attack_residual": rec.summary.get("final_relative_stationarity"), "residual_at_true_features_ORACLE": truth,
                      "feature_error_median_best_ORACLE": round(float(dist.min(1).values.median()), 3),
                      "feature_error_below_0.3_ORACLE": int((dist.min(1).values < 0.3).sum()),
                      "inversion_feature_error": round(err, 4), **judge(images, rec.labels, x, y, unseen),
                      "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
