"""The practitioner zoo (benchmarks/practitioner/): a tiny victim built by its own functions, saved as a user would."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import torch

from exhume_benchmarks.practitioner import build


def tiny_frozen_head_adam() -> build.Spec:
    """The zoo's frozen-feature-extractor victim, shrunk (20 images, 2 epochs, a 64-image pre-training), trained with Adam."""
    return replace(build.BY_NAME["mnist-frozen-head"], name="tiny", optimizer="adam", lr=1e-3, n=20, unseen=30, epochs=2,
                   batch=8, pretrain=replace(build._MNIST_PRE, n=64, epochs=1))


def test_tiny_victim_files_complete_and_consistent(tmp_path):
    from safetensors.torch import load_file

    from exhume.audit import load_images, load_model_class, load_weights
    from exhume.audit.command import KEYS, settings

    spec = tiny_frozen_head_adam()
    info = build.build_victim(spec, tmp_path)
    folder = tmp_path / "tiny"
    assert build.complete(folder, spec) and (folder / "optimizer_state.safetensors").is_file()
    assert info["steps"] == spec.epochs * math.ceil(spec.n / spec.batch)
    end, start = load_file(str(folder / "weights.safetensors")), load_file(str(folder / "start.safetensors"))
    assert sorted(end) == sorted(start)
    assert sorted(info["frozen"]) == [k for k in end if k.startswith("trunk.")] and info["frozen"]
    for k in end:  # frozen parameters equal their start, trained ones moved
        assert torch.equal(end[k], start[k]) == k.startswith("trunk."), k
    assert sorted(load_file(str(folder / "optimizer_state.safetensors"))) == sorted(k for k in end if k.startswith("head."))
    pre = json.loads((folder / "pretrain.json").read_text())
    split = info["split"]
    for a, b in ((pre["indices"], split["train_indices"]), (pre["indices"], split["unseen_indices"]),
                 (split["train_indices"], split["unseen_indices"])):
        assert not set(a) & set(b)
    cfg = settings(__import__("argparse").Namespace(config=str(folder / "audit.toml"), param=[], **{k: None for k in KEYS}))
    model = load_weights(load_model_class(cfg.model, cfg.model_args), cfg.weights)
    x, y = load_images(cfg.train, need_labels=True)
    assert len(x) == spec.n and len(load_images(cfg.unseen, need_labels=False)[0]) == 30
    with torch.no_grad():
        pred = (model((torch.from_numpy(x) - 0.1307) / 0.3081).squeeze(1) > 0).long().numpy()
    assert float((pred == y).mean()) == info["train_accuracy"]
    assert cfg.loss == "logistic" and cfg.weight_decay == spec.weight_decay and cfg.normalize == "0.1307,0.3081"
    build.build_victim(spec, tmp_path / "again")  # seeded: the same weights byte for byte
    assert (folder / "weights.safetensors").read_bytes() == (tmp_path / "again" / "tiny" / "weights.safetensors").read_bytes()
