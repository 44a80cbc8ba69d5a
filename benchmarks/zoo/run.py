"""Build the victim zoo and attack every victim at an equal wall-clock budget, in parallel.

    python benchmarks/zoo/run.py all --out runs/zoo --seconds 90 --slots 8 --cores-per-job 2 \\
        --fashion-root /usr/share/datasets/fashion-mnist --methods new old reference

Each job (one victim × one method) runs in its own process pinned to ``--cores-per-job`` cores with
``taskset`` (``OMP_NUM_THREADS`` and torch's thread count set to match); the attack gets
``--seconds`` of wall time, then the job evaluates with :func:`exhume.evaluate` (1000 unseen pool
images, the control count on held-out non-members; evaluation time is not part of the budget).

Methods:

- ``new``: the default attack, ``exhume.attack(victim, max_seconds=...)``: the restart portfolio
  (its default variants and number of restarts, restarts side by side on the job's cores) with
  kkt's current defaults.
- ``old``: one kkt run with the defaults of main before issue 10 (``OLD_KKT``: last iterate, constant
  learning rate, no averaging, multipliers learned at 1e-2, no projection onto the data's span, the
  runner-up margin for multiclass victims).
- ``reference``: the published recipe (``benchmarks/zoo/reference.py``).
- ``kkt:{json}``: one kkt run with these parameter overrides (for choosing the defaults).
- ``pfR:{json}``: R restarts of kkt with the overrides, budget split evenly, candidates pooled.
- ``pfv:[{json}, ...]``: the default portfolio (sized by its probe) with these variants.
- ``pfr:N``: the default portfolio (default variants) with N restarts instead of the sizing's choice.
- ``newpair``: the default portfolio run with kkt's ``background=0`` (raw candidates), judged twice:
  as returned (``raw_*`` fields) and with the dark floor ``background="auto"`` would have applied
  (the main fields), so the two differ in that output step only, at the same iterations and seconds
  (near-duplicates are merged on the raw candidates; the default merges floored ones).

``--keep`` saves each job's returned reconstruction in ``OUT/reconstructions/<victim>__<method>__s<seed>/``,
for judging again (``research/memorised_sets.py``: which training images each method memorises).

``table`` gathers ``results.csv``, ``results.json`` and ``table.md`` from the job files.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: exhume and benchmarks.zoo without installing

#: kkt as on main before issue 10: the last iterate, constant learning rate, u learned at 1e-2 (other defaults current)
OLD_KKT = {"average_decay": 0.0, "keep": "last", "lr_schedule": "constant", "lr_lambda": 1e-2, "subspace": "off",
           "formulation": "margin"}


def pooled(recons, method: str, extra: dict):
    import torch

    from exhume.attacks import Reconstruction, RunRecord

    first = recons[0].record
    record = RunRecord(seconds=round(sum(r.record.seconds for r in recons), 3), equation=first.equation, threat_model=first.threat_model,
                       init=first.init, oracle_init=first.oracle_init, settings={**first.settings, **extra},
                       extras={"iterations": [r.record.iterations for r in recons], "kept_iteration": [r.record.kept_iteration for r in recons]})
    return Reconstruction(method=method, candidates=torch.cat([r.candidates for r in recons]),
                          labels=torch.cat([r.labels for r in recons]), scores=torch.cat([r.scores for r in recons]),
                          record=record, seed=recons[0].seed)


def restart_results(run) -> list:
    """The finished reconstructions saved in ``run/restarts/<k>/`` (a portfolio's folder) or ``run/<k>/``
    (``research/first_layer_start.py``'s), in restart order; a clear exit when there are none."""
    from exhume.attacks import load_reconstruction

    run = Path(run)
    base = run / "restarts" if (run / "restarts").is_dir() else run
    if not base.is_dir():
        raise SystemExit(f"{run} is not a folder of saved restarts")
    folders = sorted((p for p in base.iterdir() if p.name.isdigit() and (p / "reconstruction.json").exists()), key=lambda p: int(p.name))
    if not folders:
        raise SystemExit(f"no finished restarts (<k>/reconstruction.json) in {base}")
    return [load_reconstruction(p) for p in folders]


def restarts(view, seconds: float, seed: int, variants: list[dict]):
    """Sequential restarts, the budget split evenly, candidates pooled (the portfolio without its machinery)."""
    from exhume.attacks import get_attack
    from exhume.deadline import Deadline

    each = seconds / len(variants)
    runs = [get_attack("kkt", iterations=10_000_000, **v).run(view, seed=seed + 100 * i, progress=False, deadline=Deadline.after(each))
            for i, v in enumerate(variants)]
    return pooled(runs, "kkt-restarts", {"variants": variants, "seconds_each": each})


def new_default(view, seconds: float, seed: int):
    """The new default attack at this budget: exhume's restart portfolio with its default variants and restarts."""
    from exhume.portfolio import run_portfolio

    return run_portfolio(view, "kkt", max_seconds=seconds, seed=seed, progress=False)


def attack(view, method: str, seconds: float, seed: int):
    from exhume.attacks import get_attack
    from exhume.deadline import Deadline

    if method == "new":
        return new_default(view, seconds, seed)
    if method == "newpair":
        from exhume.portfolio import run_portfolio

        return run_portfolio(view, "kkt", max_seconds=seconds, seed=seed, progress=False, background=0)
    if method == "old":
        return get_attack("kkt", iterations=10_000_000, **OLD_KKT).run(view, seed=seed, progress=False, deadline=Deadline.after(seconds))
    if method == "reference":
        from benchmarks.zoo.reference import run_reference

        return run_reference(view, seconds, seed=seed)
    kind, _, overrides = method.partition(":")
    kw = json.loads(overrides) if overrides else {}
    if kind == "kkt":
        return get_attack("kkt", iterations=10_000_000, **kw).run(view, seed=seed, progress=False, deadline=Deadline.after(seconds))
    if kind == "pfv":  # the portfolio with these variants (a JSON list of overrides, restart k gets [k % len])
        from exhume.portfolio import run_portfolio

        return run_portfolio(view, "kkt", max_seconds=seconds, seed=seed, progress=False, variants=kw)
    if kind == "pfr":  # the default portfolio with this many restarts instead of the sizing's choice
        from exhume.portfolio import run_portfolio

        return run_portfolio(view, "kkt", max_seconds=seconds, seed=seed, progress=False, restarts=int(kw))
    if kind.startswith("pf"):
        return restarts(view, seconds, seed, [kw] * int(kind[2:]))
    raise SystemExit(f"unknown method {method!r}")


def job(args) -> None:
    import torch

    import exhume
    from exhume.victim import load_victim

    torch.set_num_threads(args.threads)
    victim = load_victim(args.victim)
    view = victim.attacker_view()
    t0 = time.perf_counter()
    recon = attack(view, args.method, args.seconds, args.seed)
    wall = time.perf_counter() - t0
    raw = {}
    if args.method == "newpair":  # judge the raw candidates, then those the default's dark floor returns
        from exhume.attacks.engine.priors import background_level, dark_floor

        recon.save(Path(args.result).parent.parent / "raw" / Path(args.result).stem)  # for other thresholds, post hoc
        r = exhume.evaluate(recon, victim, pool_size=1000, figures=False).metrics
        raw = {"raw_memorised": r["memorised"], "raw_control": r.get("memorised_control"), "raw_one_to_one": r["one_to_one_ssim>=0.4"]}
        tau, _ = background_level("auto", view.mean, tuple(view.input_shape))
        raw["background_tau"] = tau
        recon.candidates = dark_floor(recon.candidates.float(), tau)
    if args.keep:  # the returned candidates, for judging again (research/memorised_sets.py)
        recon.save(Path(args.result).parent.parent / "reconstructions" / Path(args.result).stem)
    res = exhume.evaluate(recon, victim, pool_size=1000, figures=False)
    m = res.metrics
    row = {"victim": Path(args.victim).name, "method": args.method, "seed": args.seed, "budget_s": args.seconds,
           "attack_wall_s": round(wall, 1),
           "iterations": recon.summary.get("iterations_per_restart") or recon.summary.get("iterations"),
           "restarts": recon.summary.get("restarts", 1),
           "sizing": ((recon.config.get("portfolio") or {}).get("sizing") or {}).get("reason"),
           "kept_iteration": recon.summary.get("kept_iteration"), "candidates": int(recon.candidates.shape[0]),
           "memorised": m["memorised"], "control": m.get("memorised_control"),
           "one_to_one": m["one_to_one_ssim>=0.4"], "one_to_one_control": m.get("one_to_one_ssim>=0.4_control"),
           "support_estimate": m.get("support_estimate"),
           "victim_train_accuracy": victim.metrics.get("train_accuracy"), "victim_epochs": victim.metrics.get("epochs"), **raw}
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result).write_text(json.dumps(row, default=str))
    print(json.dumps(row, default=str), flush=True)


def build(args) -> None:
    import torch

    from benchmarks.zoo.zoo import BY_NAME
    from benchmarks.zoo.zoo import build as build_victim

    torch.set_num_threads(args.threads)
    v = build_victim(BY_NAME[args.name], args.out, args.fashion_root)
    print(args.name, {k: v.metrics.get(k) for k in ("train_accuracy", "test_accuracy", "epochs", "stationarity_residual")}, flush=True)


def parallel(commands: list[list[str]], slots: int, cores: int, log: Path, first: int = 0) -> None:
    """Run the commands, at most ``slots`` at a time, each pinned to its own ``cores`` cores (from core ``first``)."""
    free = [list(range(first + i * cores, first + (i + 1) * cores)) for i in range(slots)]
    running: list[tuple[subprocess.Popen, list[int]]] = []
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        for cmd in commands:
            while not free:
                for p, c in list(running):
                    if p.poll() is not None:
                        running.remove((p, c))
                        free.append(c)
                time.sleep(0.5)
            c = free.pop(0)
            env = {**os.environ, "OMP_NUM_THREADS": str(cores), "MKL_NUM_THREADS": str(cores)}
            pinned = ["taskset", "-c", ",".join(map(str, c))] + cmd + ["--threads", str(cores)]
            running.append((subprocess.Popen(pinned, stdout=fh, stderr=subprocess.STDOUT, env=env), c))
        for p, _ in running:
            p.wait()


def run_all(args) -> None:
    from benchmarks.zoo.zoo import ZOO

    out = Path(args.out)
    me = [sys.executable, str(Path(__file__).resolve())]
    names = args.victims or [v.name for v in ZOO]
    todo = [me + ["build", "--name", n, "--out", str(out / "victims" / n)] + (["--fashion-root", args.fashion_root] if args.fashion_root else [])
            for n in names if not (out / "victims" / n / "victim.json").exists()]
    t0 = time.perf_counter()
    parallel(todo, args.slots, args.cores_per_job, out / "log.txt", args.first_core)
    print(f"built {len(todo)} victims in {time.perf_counter() - t0:.0f} s", flush=True)
    jobs = []
    for n in names:  # the methods side by side on each victim, so that a noisy spell hits both
        for method in args.methods:
            tag = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in method)[:80]
            result = out / "results" / f"{n}__{tag}__s{args.seed}.json"
            if not result.exists():
                jobs.append(me + ["job", "--victim", str(out / "victims" / n), "--method", method, "--seconds", str(args.seconds),
                                  "--seed", str(args.seed), "--result", str(result)] + (["--keep"] if args.keep else []))
    t0 = time.perf_counter()
    parallel(jobs, args.slots, args.cores_per_job, out / "log.txt", args.first_core)
    print(f"ran {len(jobs)} jobs in {time.perf_counter() - t0:.0f} s", flush=True)
    table(args)


def table(args) -> None:
    out = Path(args.out)
    rows = [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]
    if not rows:
        return
    keys = list(rows[0])
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    victims = list(dict.fromkeys(r["victim"] for r in rows))
    cell = {(r["victim"], r["method"]): r for r in rows}

    def fmt(r):
        if r is None:
            return "–"
        its = r["iterations"]
        its = "+".join(str(i) for i in its) if isinstance(its, list) else str(its)
        return f"{r['memorised']} / {r['control']} ({r['one_to_one']}; {its} it)"

    def support(v):  # the victim's, the same in every row of it (older result files lack it)
        s = next((r.get("support_estimate") for r in rows if r["victim"] == v and r.get("support_estimate")), None)
        return "–" if s is None else f"{s:.0f}"

    lines = ["| victim | support | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    lines += [f"| {v} | {support(v)} | " + " | ".join(fmt(cell.get((v, m))) for m in methods) + " |" for v in victims]
    text = ("memorised / control (one-to-one SSIM ≥ 0.4; iterations per restart); support: the training points "
            "carrying the equation (exhume.evaluation.support_estimate)\n\n" + "\n".join(lines) + "\n")
    (out / "table.md").write_text(text)
    print(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", default="runs/zoo")
    a.add_argument("--seconds", type=float, default=90.0)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--slots", type=int, default=1)
    a.add_argument("--cores-per-job", type=int, default=2)
    a.add_argument("--first-core", type=int, default=0, help="leave the cores below this one free")
    a.add_argument("--fashion-root", default=None)
    a.add_argument("--victims", nargs="*", default=None)
    a.add_argument("--methods", nargs="+", default=["new", "old", "reference"])
    a.add_argument("--keep", action="store_true", help="save each job's reconstruction in OUT/reconstructions/<victim>__<method>__s<seed>/")
    b = sub.add_parser("build")
    b.add_argument("--name", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--fashion-root", default=None)
    b.add_argument("--threads", type=int, default=2)
    j = sub.add_parser("job")
    for k in ("--victim", "--method", "--result"):
        j.add_argument(k, required=True)
    j.add_argument("--seconds", type=float, required=True)
    j.add_argument("--seed", type=int, default=0)
    j.add_argument("--threads", type=int, default=2)
    j.add_argument("--keep", action="store_true")
    t = sub.add_parser("table")
    t.add_argument("--out", default="runs/zoo")
    args = ap.parse_args(argv)
    {"all": run_all, "build": build, "job": job, "table": table}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
