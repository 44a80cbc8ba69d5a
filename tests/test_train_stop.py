"""``exhume train``'s stopping rules say what stopped them, and the documented CNN recipe runs as measured."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from exhume.cli import build_parser, main
from exhume.commands.train import DEFAULT_SECONDS, configs
from exhume.equations.span import span_gap
from exhume.victim import load_victim

ROOT = Path(__file__).resolve().parents[1]
#: the CNN recipe as it was measured (benchmarks/notes/2026-11-28-cnn-span.md, section 1: stopped on the span at
#: 8,200 epochs, 273 s under load, with --seconds 1200, which a threshold now makes unnecessary)
RECIPE = {"data": "mnist", "task": "odd-even", "n": 100, "arch": "cnn:16;fc=256;pool=avg", "wd": 5e-3, "lr": 0.2,
          "optimizer": "gd", "span_threshold": 1e-4, "batch_size": None}
RECIPE_EPOCHS_NEEDED = 8_200


def _train(tmp_path, *flags: str) -> tuple[dict, str]:
    out = tmp_path / "v"
    assert main(["train", "-o", str(out), "--data", "digits", "-n", "8", "--no-progress", "--force", *flags]) == 0
    return json.loads((out / "victim.json").read_text())["metrics"], str(out)


def test_an_epoch_cap_reached_before_the_span_threshold_is_a_warning_with_the_value_reached(tmp_path, capsys):
    metrics, out = _train(tmp_path, "--arch", "cnn:8;fc=64;pool=avg", "--wd", "5e-2", "--lr", "0.5", "--epochs", "40",
                          "--span-threshold", "1e-12")
    printed = capsys.readouterr().out
    span = metrics["stop"]["thresholds"]["span_threshold"]
    reached = span_gap(load_victim(out).model, 8)  # the saved weights' own σ_{n+1}/σ_1
    assert metrics["stop_reason"] == "max_epochs" and not span["met"] and span["reached"] == pytest.approx(reached, rel=1e-4)
    assert "training until --span-threshold 1e-12 is met, or 40 epochs (--epochs); no time cap" in printed
    assert (f"WARNING: the epoch cap (40) stopped training before --span-threshold 1e-12 (σ_{{n+1}}/σ_1 reached {reached:.3g}) "
            "was met: raise --epochs") in printed


def test_a_time_cap_reached_before_the_loss_threshold_says_so(tmp_path, capsys):
    metrics, _ = _train(tmp_path, "--arch", "mlp:16", "--epochs", "1000000", "--seconds", "0.05", "--loss-threshold", "1e-12")
    printed = capsys.readouterr().out
    assert metrics["stop_reason"] == "max_seconds" and metrics["stop"]["max_seconds"] == 0.05
    assert (f"WARNING: the time cap (0.05 s) stopped training before --loss-threshold 1e-12 (the training loss reached "
            f"{metrics['final_loss']:.3g}) was met: raise --seconds") in printed


def test_a_threshold_met_names_itself_and_no_threshold_names_the_cap(tmp_path, capsys):
    metrics, _ = _train(tmp_path, "--arch", "mlp:16", "--epochs", "3000", "--loss-threshold", "0.5")
    assert metrics["stop_reason"] == "loss_threshold" and metrics["stop"]["thresholds"]["loss_threshold"]["met"]
    assert "; stopped by --loss-threshold 0.5 (the training loss " in capsys.readouterr().out
    metrics, _ = _train(tmp_path, "--arch", "mlp:16", "--epochs", "5")
    printed = capsys.readouterr().out
    assert metrics["stop"]["thresholds"] == {} and printed.splitlines()[0].endswith("; stopped by the epoch cap (5)")


def _args(command: str):
    return build_parser().parse_args(shlex.split(command)[1:] + ["-o", "unused"])


def test_a_threshold_lifts_the_default_time_cap_and_an_explicit_one_stays():
    cfg, _ = configs(_args("exhume train --arch mlp:8 --span-threshold 1e-4"))
    assert cfg.max_seconds is None
    assert configs(_args("exhume train --arch mlp:8"))[0].max_seconds == DEFAULT_SECONDS
    assert configs(_args("exhume train --arch mlp:8 --residual-threshold 1e-3 --seconds 30"))[0].max_seconds == 30


def _documented_recipes() -> list[str]:
    """Every ``exhume train`` command of README.md and docs/*.md that trains the CNN recipe to the span (a command may
    be broken over lines inside its backticks)."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for cmd in re.findall(r"exhume\s+train\s[^`]*--span-threshold[^`]*", page.read_text()):
            if "cnn:16;fc=256;pool=avg" in cmd:
                found.append(" ".join(cmd.split()))
    return found


def test_the_documented_cnn_recipe_trains_as_it_was_measured():
    recipes = _documented_recipes()
    assert len(recipes) >= 2  # README and docs/METHODS.md §5
    for command in recipes:
        args = _args(command)
        cfg, dp = configs(args)
        got = {"data": args.data, "task": args.task, "n": args.n, "arch": args.arch, "wd": args.wd, "lr": args.lr,
               "optimizer": args.optimizer, "span_threshold": args.span_threshold, "batch_size": args.batch_size}
        assert got == RECIPE, command
        assert dp is None and cfg.max_epochs >= RECIPE_EPOCHS_NEEDED, command
        assert cfg.max_seconds is None, f"{command}: a time cap would stop it before the span"
