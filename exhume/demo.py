"""``exhume demo``: train a small victim on the bundled MNIST digits, attack it, evaluate.

Settings (after docs/METHODS.md §1): a bias-free MLP 784-256-256-1 (first layer N(0,1)·1e-4), 100
digits odd/even, mean subtracted, logistic loss, full-batch GD lr 0.2 with weight decay 5e-3 for 6000
epochs; then the ``kkt`` attack (a portfolio of restarts, m = 200 each) for a fixed wall-clock budget;
then the evaluation against the 100 training digits and a pool of 1000 unseen digits. Times and
results measured: ``docs/defaults.md#demo-budgets``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from exhume.deadline import Deadline
from exhume.portfolio.report import sizing_line
from exhume.victim.recipe import PAPER_ARCH, PAPER_TRAIN

DEMO_DATA = {"data": "mnist", "task": "odd-even", "n": 100, "arch": PAPER_ARCH}
# 6000 epochs leak more than a victim trained for a fixed 60 s; max_seconds only caps a slow machine.
DEMO_TRAIN = {"loss": "logistic", **PAPER_TRAIN, "max_epochs": 6000, "max_seconds": 60.0}
# The attack is the default restart portfolio (exhume.portfolio): restarts side by side on the local
# cores, sized from the attack's measured iteration rate (exhume/portfolio/sizing.py), candidates
# pooled, because restarts with other seeds find other digits; 360 s of attack (what the whole demo then
# takes: the module docstring).
DEMO_ATTACK: dict[str, Any] = {"iterations": 1_000_000}
DEMO_ATTACK_SECONDS = 360.0
#: what a demo writes into its folder: its victim and its attack run (evaluation and report inside)
DEMO_FILES = ("victim", "attack")


def demo_seconds(train_seconds: float | None = None, attack_seconds: float | None = None) -> float:
    """The whole demo's budget: its training's and its attack's together (420 s by default)."""
    return (train_seconds or DEMO_TRAIN["max_seconds"]) + (attack_seconds or DEMO_ATTACK_SECONDS)


def run_demo(out: str | Path = "runs/demo", seed: int = 0, device: str = "cpu", dtype: str = "float32",
             train_seconds: float | None = None, attack_seconds: float | None = None, resume: bool = False,
             progress: bool = True, force: bool = False, deadline: Deadline | None = None) -> dict[str, Any]:
    """Train, attack, evaluate and report into ``out``; an earlier demo there is continued only with
    ``resume=True`` (its victim reused, its attack continued) and replaced only with ``force=True``.

    The whole demo keeps the sum of its two budgets, training's and the attack's (:func:`demo_seconds`), its
    ``deadline`` (``exhume demo``: counted from its process's start; None: from this call): the
    attack gets its own budget unless what came before it and the evaluation's estimate
    (:func:`exhume.evaluation.cost.evaluation_estimate`) leave less, and then what they leave (at least half of it)."""
    from exhume.device import check_device
    from exhume.files.runfolder import own_run_folder

    deadline = Deadline.after(demo_seconds(train_seconds, attack_seconds)) if deadline is None else deadline
    check_device(device)
    out = Path(out)
    # the whole demo folder is locked: a second demo on it (which would retrain OUT/victim under a running
    # attack and replace OUT/attack) is refused while this one runs, --resume or not
    with own_run_folder(out, resume=resume, force=force, run_files=DEMO_FILES, resume_from=None, holds="a demo"):
        return _demo(out, seed, device, dtype, train_seconds, attack_seconds, resume, progress, deadline)


def _demo(out: Path, seed: int, device: str, dtype: str, train_seconds: float | None, attack_seconds: float | None,
          resume: bool, progress: bool, deadline: Deadline) -> dict[str, Any]:
    import exhume
    from exhume.evaluation.table import format_table, summary_rows
    from exhume.victim import TrainConfig, load_victim, make_victim

    # the same layout as 'exhume attack' + 'exhume evaluate' + 'exhume report': RUN/evaluation, RUN/report.html
    victim_dir, attack_dir = out / "victim", out / "attack"
    eval_dir = attack_dir / "evaluation"
    if resume and (victim_dir / "victim.json").exists():
        victim = load_victim(victim_dir)
        print(f"[1/3] reusing the victim in {victim_dir}")
    else:
        train_cfg = TrainConfig(**{**DEMO_TRAIN, **({"max_seconds": train_seconds} if train_seconds else {})})
        print(f"[1/3] training the victim: {DEMO_DATA['arch']} on {DEMO_DATA['n']} MNIST digits ({DEMO_DATA['task']}), "
              f"GD lr {train_cfg.lr}, weight decay {train_cfg.weight_decay}, {train_cfg.max_epochs} epochs")
        victim = make_victim(DEMO_DATA["data"], DEMO_DATA["task"], DEMO_DATA["n"], DEMO_DATA["arch"], train_cfg,
                             seed=seed, progress=progress, dtype=getattr(torch, dtype), device=device)
        victim.save(victim_dir)
    m = victim.metrics
    print(f"      train accuracy {m['train_accuracy']:.3f}, test accuracy {_number(m.get('test_accuracy')):.3f}, "
          f"relative stationarity residual {m.get('stationarity_residual')}")
    budget = _attack_budget(victim, attack_seconds or DEMO_ATTACK_SECONDS, deadline)
    print(f"[2/3] kkt attack from the weights alone, {budget['attack_budget_seconds']:.0f} s budget"
          + ("" if budget["attack_budget_seconds"] >= budget["asked"] else f" (the demo's {deadline.seconds:g} s less "
             f"{budget['before_attack_seconds']:.0f} s of set-up and training and "
             f"{budget['evaluation_estimate_seconds']['total']:.0f} s kept for the evaluation)"))
    # the demo replaces its own earlier run unless resumed (a portfolio keeps its restarts in restarts/)
    resume_attack = resume and ((attack_dir / "checkpoint.pt").is_file() or (attack_dir / "restarts").is_dir())
    recon = exhume.attack(victim, method="kkt", seed=seed, out=attack_dir, resume=resume_attack, force=not resume_attack, device=device,
                          progress=progress, deadline=Deadline.after(budget["attack_budget_seconds"]), dtype=dtype, **DEMO_ATTACK)
    record = recon.record
    per = [r.iterations for r in record.portfolio.restarts] if record.portfolio else []
    print(f"      {record.iterations} iterations in {record.seconds:.0f} s"
          + (f" ({len(per)} restarts: {', '.join(map(str, per))})" if per else ""))
    sized = sizing_line({"sizing": record.portfolio.sizing} if record.portfolio else {})
    if sized:
        print(f"      {sized}")
    print("[3/3] evaluating against the 100 training digits and 1000 unseen digits")
    result = exhume.evaluate(recon, victim, pool_size=1000, out=eval_dir)
    wall = deadline.spent()
    result.metrics["demo_wall_seconds"] = round(wall, 1)
    result.metrics["demo_budget"] = {**budget, "attack_seconds": round(record.seconds, 1), "wall_seconds": round(wall, 1)}
    result.save(eval_dir)
    from exhume.report import write_report

    report = write_report(attack_dir)
    print()
    print(format_table(summary_rows(result.metrics) + [("total wall time", f"{wall:.0f} s")]))
    print()
    print(f"best pairs (training | reconstruction | best unseen digit): {eval_dir / 'best_pairs.png'}")
    print(f"metrics: {eval_dir / 'metrics.json'}   SSIM vs margin: {eval_dir / 'ssim_vs_margin.png'}")
    print(f"audit report (one HTML page, opens offline): {report}")
    return result.metrics


def _attack_budget(victim, asked: float, deadline: Deadline) -> dict[str, Any]:
    """The attack's seconds: ``asked``, or less where the time ``deadline`` has spent and the evaluation's estimate
    leave less of its seconds (at least half of ``asked``), with the numbers it was decided on."""
    from exhume.evaluation.cost import evaluation_estimate
    from exhume.portfolio.plan import default_workers
    from exhume.portfolio.variants import MAX_AUTO_RESTARTS, SECONDS_PER_RESTART

    n = DEMO_DATA["n"]
    restarts = min(default_workers() * max(1, round(asked / SECONDS_PER_RESTART)), MAX_AUTO_RESTARTS)  # the most sizing gives
    estimate = evaluation_estimate(n, victim.load_train_set().x, 1000 + n, 2 * n * restarts)  # kkt: 2n candidates a restart
    before, total = deadline.spent(), deadline.seconds
    left = total - before - estimate["total"]
    attack = max(min(asked, left), asked / 2)
    return {"max_seconds": total, "asked": asked, "before_attack_seconds": round(before, 1),
            "evaluation_estimate_seconds": estimate, "attack_budget_seconds": round(attack, 1),
            "covered": attack <= left,  # where attack = left, before + attack + estimate can round past total
            "definition": "the demo keeps its training's and its attack's budgets together, from its start: the attack "
                          "gets its own (asked) unless set-up, training and the evaluation's estimate leave less"}


def _number(v: float | None) -> float:
    """A metric read back from victim.json (where NaN is written as null)."""
    return float("nan") if v is None else v
