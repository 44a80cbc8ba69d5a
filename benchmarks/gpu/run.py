"""The papers' settings on one GPU in eight minutes: each victim trained, then attacked by exhume and by the reference
recipe at an equal budget, all judged alike, one table.

    python benchmarks/gpu/run.py --out /tmp/gpu-bench            # one H100/H200-class GPU, about 7-8 minutes
    python benchmarks/gpu/run.py --tiny --out /tmp/gpu-tiny      # the same on CPU at a tiny size (the test suite)

Victims (MNIST from exhume's bundled 10,000 digits, full-batch gradient descent, lr 0.2):

* ``haim-nowd``: Haim et al.'s setting, odd/even, n = 500, 784-1000-1000-1 without biases, first layer at
  N(0, 1)·1e-4, logistic loss, no weight decay (trained 40 s, the others 20 s; ``--train-scale``);
* ``haim-wd5e-3``: the same with weight decay 5e-3;
* ``multiclass``: Buzaglo et al.'s multiclass setting, 10 classes, 50 per class, 784-1000-1000-10, cross-entropy;
* ``cnn-wd5e-3``: a 28×28 CNN (``cnn:16;fc=256;pool=avg``), odd/even, n = 100, weight decay 5e-3.

Each is attacked by ``exhume.attack`` (its default portfolio; on a CUDA device the restarts run batched in one
process, :mod:`exhume.portfolio.batched`) and by ``benchmarks/zoo/reference.py`` (the published recipe, float64,
one run), each given ``--attack-seconds``; then ``exhume.evaluate`` (pool ``--pool`` unseen images, the control of
non-members). Columns: memorised / control, one-to-one SSIM ≥ 0.4, iterations per second (a portfolio's
iterations summed over its restarts, over the attack's wall time), wall time of the attack against its budget.
TF32 stays off (``torch.backends.*.allow_tf32 = False``): no measurement yet shows it gives equal results.

Writes ``OUT/results.json`` and ``OUT/table.md`` after every row (a cut run keeps its rows); victims in ``OUT/victims``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: exhume and exhume_benchmarks.zoo without installing


@dataclass(frozen=True)
class Case:
    name: str
    task: str
    n: int
    arch: str
    wd: float
    train_seconds: float  # wall-clock cap of training (epochs are capped too, by --epochs)


HAIM = "mlp:1000,1000;bias=none;init=1e-4"
CASES = (
    Case("haim-nowd", "odd-even", 500, HAIM, 0.0, 40.0),
    Case("haim-wd5e-3", "odd-even", 500, HAIM, 5e-3, 20.0),
    Case("multiclass", "multiclass", 500, HAIM, 0.0, 20.0),
    Case("cnn-wd5e-3", "odd-even", 100, "cnn:16;fc=256;pool=avg", 5e-3, 20.0),
)
#: --tiny: the same four settings, small enough for the test suite on CPU
TINY = (
    Case("haim-nowd", "odd-even", 10, "mlp:32,32;bias=none;init=1e-3", 0.0, 1.0),
    Case("haim-wd5e-3", "odd-even", 10, "mlp:32,32;bias=none;init=1e-3", 5e-3, 1.0),
    Case("multiclass", "multiclass", 20, "mlp:32,32;bias=none;init=1e-3", 0.0, 1.0),
    Case("cnn-wd5e-3", "odd-even", 10, "cnn:4;fc=16;pool=avg", 5e-3, 1.0),
)
COLUMNS = ("victim", "method", "n", "memorised", "control", "one_to_one", "iterations", "it_per_s", "restarts",
           "attack_wall_s", "budget_s", "train_s", "epochs", "train_loss")


def train(case: Case, folder: Path, device: str, epochs: int, test_size: int):
    """The victim of ``case``, trained on ``device`` and saved in ``folder``; returned as loaded back (on the CPU)."""
    import torch

    import exhume
    from exhume.victim import TrainConfig, make_victim

    loss = "cross-entropy" if case.task == "multiclass" else "logistic"
    cfg = TrainConfig(loss=loss, optimizer="gd", lr=0.2, weight_decay=case.wd, max_epochs=epochs, max_seconds=case.train_seconds)
    t0 = time.perf_counter()
    victim = make_victim("mnist", case.task, case.n, case.arch, cfg, seed=0, progress=False, test_size=test_size,
                         dtype=torch.float32, device=device)
    seconds = time.perf_counter() - t0
    victim.save(folder)
    return exhume.load_victim(folder), seconds


def attack(victim, method: str, seconds: float, device: str, args):
    """``(reconstruction, wall seconds, iterations, restarts)`` of one method at a budget of ``seconds``."""
    import exhume
    from exhume_benchmarks.zoo.reference import run_reference

    t0 = time.perf_counter()
    if method == "reference":
        recon = run_reference(victim.attacker_view(), seconds, device=device)
        return recon, time.perf_counter() - t0, int(recon.summary["iterations"]), 1
    kw = {} if args.restarts is None else {"restarts": args.restarts, "workers": 1}
    recon = exhume.attack(victim, "kkt", max_seconds=seconds, device=device, progress=False, batch_restarts=args.batch_restarts, **kw)
    wall = time.perf_counter() - t0
    rows = (recon.config.get("portfolio") or {}).get("restarts")
    its = sum(int(r.get("iterations") or 0) for r in rows) if rows else int(recon.summary.get("iterations") or 0)
    return recon, wall, its, len(rows) if rows else 1


def row_for(case: Case, method: str, victim, trained: float, recon, wall: float, its: int, restarts: int, args) -> dict:
    import exhume

    t0 = time.perf_counter()
    m = exhume.evaluate(recon, victim, pool_size=args.pool, figures=False).metrics
    judged = time.perf_counter() - t0
    return {"victim": case.name, "method": method, "n": case.n, "memorised": m["memorised"], "control": m.get("memorised_control"),
            "one_to_one": m["one_to_one_ssim>=0.4"], "iterations": its, "it_per_s": round(its / max(wall, 1e-9), 1),
            "restarts": restarts, "attack_wall_s": round(wall, 1), "budget_s": args.attack_seconds, "train_s": round(trained, 1),
            "epochs": victim.metrics.get("epochs"), "train_loss": victim.metrics.get("train_loss"),
            "batched": ((recon.config.get("portfolio") or {}).get("batched") or {}).get("used"),
            "candidates": int(recon.candidates.shape[0]), "evaluate_s": round(judged, 1)}


def table(rows: list[dict], meta: dict) -> str:
    lines = [f"Device: {meta['device']} ({meta['device_name']}); torch {meta['torch']}; TF32 off; total wall "
             f"{meta.get('total_s', '?')} s; each attack {meta['attack_seconds']} s; pool {meta['pool']}.", "",
             "| victim | n | method | memorised | control | one-to-one ≥ 0.4 | iterations | it/s | restarts | wall s / budget s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['victim']} | {r['n']} | {r['method']} | {r['memorised']} | {r['control']} | {r['one_to_one']} | "
                     f"{r['iterations']:,} | {r['it_per_s']} | {r['restarts']} | {r['attack_wall_s']} / {r['budget_s']:g} |")
    return "\n".join(lines) + "\n"


def write(out: Path, rows: list[dict], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    (out / "table.md").write_text(table(rows, meta))


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the victims, results.json and table.md")
    ap.add_argument("--tiny", action="store_true", help="tiny victims, on CPU, seconds per attack (the test suite's size)")
    ap.add_argument("--device", default=None, help="torch device (default: cuda, or cpu with --tiny)")
    ap.add_argument("--attack-seconds", type=float, default=None, help="each attack's budget (default 35; --tiny 1.5)")
    ap.add_argument("--train-scale", type=float, default=1.0, help="multiplies every victim's training seconds")
    ap.add_argument("--epochs", type=int, default=None, help="training epoch cap (default 1,000,000; --tiny 200)")
    ap.add_argument("--pool", type=int, default=None, help="unseen images of the evaluation's pool (default 1000; --tiny 100)")
    ap.add_argument("--victims", nargs="+", default=None, choices=[c.name for c in CASES])
    ap.add_argument("--methods", nargs="+", default=["exhume", "reference"], choices=["exhume", "reference"])
    ap.add_argument("--restarts", type=int, default=None, help="exhume's restarts (default: its sizing; --tiny 2)")
    ap.add_argument("--batch-restarts", default="auto", choices=("auto", "on", "off"), help="exhume's batch_restarts (--tiny: on)")
    args = ap.parse_args(argv)
    tiny = args.tiny
    args.device = args.device or ("cpu" if tiny else "cuda")
    args.attack_seconds = args.attack_seconds or (1.5 if tiny else 35.0)
    args.epochs = args.epochs or (200 if tiny else 1_000_000)
    args.pool = args.pool or (100 if tiny else 1000)
    if tiny:
        args.restarts = args.restarts or 2
        args.batch_restarts = "on" if args.batch_restarts == "auto" else args.batch_restarts
    return args


def main(argv=None) -> int:
    import torch

    args = parse(argv)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    cases = [replace(c, train_seconds=c.train_seconds * args.train_scale) for c in (TINY if args.tiny else CASES)
             if args.victims is None or c.name in args.victims]
    out = Path(args.out)
    dev = torch.device(args.device)
    meta = {"device": args.device, "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "attack_seconds": args.attack_seconds, "pool": args.pool, "tiny": args.tiny,
            "cases": [asdict(c) for c in cases], "command": " ".join(sys.argv)}
    rows: list[dict] = []
    t0 = time.perf_counter()
    for case in cases:
        victim, trained = train(case, out / "victims" / case.name, args.device, args.epochs, 50 if args.tiny else 500)
        for method in args.methods:
            recon, wall, its, restarts = attack(victim, method, args.attack_seconds, args.device, args)
            rows.append(row_for(case, method, victim, trained, recon, wall, its, restarts, args))
            meta["total_s"] = round(time.perf_counter() - t0, 1)
            write(out, rows, meta)
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
