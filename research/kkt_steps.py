"""One kkt run with its defaults, for whole-process comparisons of two checkouts (this one and main's).

Unlike the other benchmarks it does not put its own checkout on ``sys.path``: the ``exhume`` it
imports is the one ``PYTHONPATH`` (or the environment) names, and it prints that module's path,
so the same command times main's code and this branch's side by side:

    cd <this checkout>
    PYTHONPATH=. OMP_NUM_THREADS=1 taskset -c 0 python research/kkt_steps.py --arch "cnn:16;fc=256;pool=avg" --iterations 150
    PYTHONPATH=../main OMP_NUM_THREADS=1 taskset -c 0 python research/kkt_steps.py --arch "cnn:16;fc=256;pool=avg" --iterations 150
    PYTHONPATH=. OMP_NUM_THREADS=1 python research/kkt_steps.py --victim runs/zoo/victims/mnist-cnn-wd5e-3 --seconds 240

``--arch``: a victim of that architecture with seeded random weights on 28×28 inputs (a step's cost
does not depend on the weights; n guessed 100, so m = 200), not judged. ``--victim``: a saved
victim, judged by ``exhume.evaluate`` (1000 unseen pool images, the control on held-out
non-members: evaluator-side). One thread (``torch.set_num_threads(1)``), seed 0.
"""

from __future__ import annotations

import argparse
import json

import torch


def arch_view(arch: str, classes: int):
    from exhume.models.builders import build_model
    from exhume.victim import AttackerView

    torch.manual_seed(0)
    model = build_model(arch, (1, 28, 28), 1 if classes == 2 else classes).eval()
    return AttackerView(model=model, task="binary" if classes == 2 else "multiclass", input_shape=(1, 28, 28),
                        mean=torch.full((1, 28, 28), 0.13), loss="logistic" if classes == 2 else "cross-entropy",
                        weight_decay=5e-3, num_classes=None if classes == 2 else classes, n_train_hint=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--arch", help="an architecture spec, e.g. 'cnn:16;fc=256;pool=avg'")
    what.add_argument("--victim", help="a saved victim folder")
    ap.add_argument("--classes", type=int, default=2, help="with --arch: 2 (binary) or the number of classes")
    budget = ap.add_mutually_exclusive_group(required=True)
    budget.add_argument("--iterations", type=int)
    budget.add_argument("--seconds", type=float)
    ap.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="a kkt parameter (e.g. trace=off)")
    args = ap.parse_args(argv)
    params = dict(kv.split("=", 1) for kv in args.param)
    torch.set_num_threads(1)
    import exhume
    from exhume.attacks import get_attack

    victim = exhume.load_victim(args.victim) if args.victim else None
    view = victim.attacker_view() if victim else arch_view(args.arch, args.classes)
    attack = get_attack("kkt", iterations=args.iterations or 10_000_000, max_seconds=args.seconds, log_every=10**9, **params)
    recon = attack.run(view, seed=0, progress=False)
    row = {"exhume": exhume.__file__, "iterations": recon.summary["iterations"], "seconds": recon.summary["seconds"],
           "ms_per_iteration": round(1000 * recon.summary["seconds"] / recon.summary["iterations"], 1),
           "final_relative_stationarity": recon.summary["final_relative_stationarity"]}
    if victim is not None:
        m = exhume.evaluate(recon, victim, pool_size=1000, figures=False).metrics
        row.update(memorised=m["memorised"], control=m.get("memorised_control"), one_to_one=m["one_to_one_ssim>=0.4"])
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
