"""Audit every practitioner-zoo victim under each method at an equal budget, jobs in parallel slots.

    nice -n 10 python benchmarks/practitioner/run.py all ZOO --out RUNS --methods default --seconds 180 \\
        --slots 2 --cores-per-job 1 [--only NAME ...]
    python benchmarks/practitioner/run.py table --out RUNS      # also: pivot, fits, membership, owner

Each job (one victim × one method) is :func:`exhume.audit` with the victim's ``audit.toml``
settings (read by ``exhume audit``'s own config loading) plus the method's extra keyword arguments,
in its own process pinned with ``taskset`` to ``--cores-per-job`` cores (the slots and pinning are
``benchmarks/zoo/run.py``'s :func:`parallel`). The attack gets ``--seconds``; the audit's evaluation
(pool and control from ``unseen.npz``) is not part of the budget. Results: ``RUNS/results/*.json``,
then ``RUNS/results.csv`` and ``RUNS/table.md``; each audit's folder in ``RUNS/audits/``.

A folder built by exhume itself (``victim.json``: the paper zoo of ``benchmarks/zoo``) is audited the same way, as
its owner would: its model, training images and labels, and 1000 more unseen images of its classes drawn as
``exhume evaluate`` draws its pool; weights only (method ``default``).

A method is a name and a function ``(victim folder, training.json) -> extra keyword arguments of
exhume.audit`` (``attack_args`` merged into the config's), so a new threat model is one entry of
:data:`METHODS`; on the command line ``audit:{json}`` passes those keyword arguments directly and
``kkt:{json}`` attack arguments (weights only), ``start:{json}`` attack arguments with the owner's known start.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root: exhume and benchmarks without installing

def owner_training(training: dict) -> dict[str, Any]:
    """The training settings an owner knows, from the victim's training.json (exhume.audit's ``training``)."""
    opt = training["optimizer"]
    out = {"optimizer": opt["name"], "lr": opt["lr"], "weight_decay": opt["weight_decay"], "steps": training["steps"]}
    if "momentum" in opt:
        out["momentum"] = opt["momentum"]
    if "betas" in opt:
        out["betas"] = tuple(opt["betas"])
    return out


def exact_recipe(training: dict) -> dict[str, Any]:
    """The whole recipe from the victim's training.json, as exhume's training settings (the exact run's threat model):
    build.py's loop is one ``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))`` iterated once an
    epoch (full batch: no shuffling)."""
    opt = training["optimizer"]
    out = {"optimizer": opt["name"], "lr": opt["lr"], "weight_decay": opt["weight_decay"], "epochs": training["epochs"],
           "batch_size": training["batch_size"] or training["n"], "drop_last": bool(training.get("drop_last", False))}
    out.update({"momentum": opt["momentum"], "nesterov": opt["nesterov"]} if opt["name"] == "sgd" else
               {"betas": tuple(opt["betas"]), "eps": opt["eps"]})
    out.update({"sampler": "random", "seed": training["seed"]} if training["shuffle"] else {"sampler": "sequential"})
    return out


def known_start(folder: Path, training: dict) -> dict[str, Any]:
    """The owner's known-start audit: the start, the training settings and (Adam) the optimiser's final state."""
    kw: dict[str, Any] = {"start": folder / "start.safetensors", "training": owner_training(training)}
    if (folder / "optimizer_state.safetensors").is_file():
        kw["optimizer_state"] = folder / "optimizer_state.safetensors"
    return kw


#: Loo et al. (2024)'s known-initialisation formulation, written here as kkt settings: loss gradients at the start and
#: the final weights with signed multipliers on θ_T − θ_0 (no decay, no span, no preconditioner), m = 2n
LOO = {"start_equation": "endpoints", "formulation": "loss", "start_decay": 1.0, "subspace": "off", "preconditioner": "none",
       "start_multipliers": "signed", "candidates_per_point": 2.0}

#: name -> (victim folder, its training.json) -> extra keyword arguments of exhume.audit
METHODS = {
    "default": lambda folder, training: {},  # weights only: the default attack
    "start": known_start,  # the owner's audit: start, training settings, optimiser state (Adam)
    "start-only": lambda folder, training: {"start": folder / "start.safetensors"},  # an attacker with the public start
    "loo": lambda folder, training: {"start": folder / "start.safetensors", "attack_args": dict(LOO)},  # the reference
    "simulate": lambda folder, training: {**known_start(folder, training), "method": "simulate"},  # SimuDy's idea, owner's knowledge
    "exact": lambda folder, training: {"start": folder / "start.safetensors", "training": exact_recipe(training), "method": "simulate",
                                       "attack_args": {"run": "exact", "restarts": 1}},  # the owner's whole recipe replayed
}
ROW_KEYS = ("victim", "method", "seed", "budget_s", "wall_s", "attack_s", "iterations", "restarts", "memorised", "n_train",
            "control", "control_size", "control_oracle", "one_to_one", "one_to_one_control", "verdict", "p_value",
            "stationarity_residual", "reason")


def zoo_parallel():
    """``benchmarks/zoo/run.py``'s :func:`parallel` (slots pinned to cores with taskset)."""
    from exhume_benchmarks.zoo.run import parallel

    return parallel


def method_kwargs(method: str, folder: Path, training: dict) -> dict[str, Any]:
    """The extra keyword arguments of exhume.audit that ``method`` stands for."""
    if method in METHODS:
        return dict(METHODS[method](folder, training))
    kind, sep, body = method.partition(":")
    if sep and kind == "audit":
        return json.loads(body)
    if sep and kind == "kkt":
        return {"attack_args": json.loads(body)}
    if sep and kind == "exact":  # the owner's whole recipe with these attack arguments
        kw = METHODS["exact"](folder, training)
        return {**kw, "attack_args": {**kw["attack_args"], **json.loads(body)}}
    if sep and kind == "start":  # the owner's known start with these attack arguments
        return {**known_start(folder, training), "attack_args": json.loads(body)}
    raise SystemExit(f"unknown method {method!r}; known: {', '.join(METHODS)}, audit:{{json}}, kkt:{{json}}, start:{{json}}, "
                     "exact:{{json}}")


def audit_settings(config: Path):
    """The victim's ``audit.toml`` read exactly as ``exhume audit --config`` reads it (paths resolved)."""
    from exhume.audit.command import KEYS, settings

    return settings(argparse.Namespace(config=str(config), param=[], **{k: None for k in KEYS}))


def zoo_victim_audit(folder: Path, method: str, seconds: float, seed: int, out: Path):
    """The audit of a victim built by exhume (``benchmarks/zoo``, a folder with ``victim.json``), as its owner would run
    it: its model, training images and labels, and ``POOL`` unseen images of the same classes (disjoint from the
    training set, as ``exhume evaluate`` draws its pool) as the unseen set; weights only (no start is kept)."""
    import exhume
    from exhume.data import dataset_of, make_pool
    from exhume.victim import load_victim

    if method != "default":
        raise SystemExit(f"{folder.name}: an exhume-built victim keeps no start or recipe; only the 'default' method applies")
    victim = load_victim(folder)
    ds = dataset_of(victim.data_spec)
    train = victim.load_train_set(ds)
    unseen = make_pool(ds, train.spec["task"], POOL + len(train), exclude=train.indices, seed=1)
    task = "binary" if victim.task == "binary" else "multiclass"
    return exhume.audit(victim.model, (train.x, train.y), (unseen.x, unseen.y), loss=victim.loss,
                        weight_decay=float(victim.weight_decay or 0.0), normalize=(victim.mean, 1.0), task=task,
                        max_seconds=seconds, out=out, seed=seed, progress=False, force=True)


#: unseen images an exhume-built victim's audit gets beyond its training set's size (the zoo's pool)
POOL = 1000


def run_audit(folder: Path, method: str, seconds: float, seed: int, out: Path):
    """One job's audit: the victim as a user's model, the method's extra settings, ``seconds`` of attack."""
    if (folder / "victim.json").is_file():
        return zoo_victim_audit(folder, method, seconds, seed, out)
    import exhume
    from exhume.audit import load_images, load_model_class, load_weights
    from exhume.audit.command import parse_normalize

    cfg = audit_settings(folder / "audit.toml")
    training = json.loads((folder / "training.json").read_text())
    extra = method_kwargs(method, folder, training)
    attack_args = {**(cfg.attack_args or {}), **extra.pop("attack_args", {})}
    model = load_weights(load_model_class(cfg.model, cfg.model_args), cfg.weights)
    x, y = load_images(cfg.train, need_labels=True)
    unseen, unseen_y = load_images(cfg.unseen, need_labels=False)  # the labels, when kept, score membership fairly
    return exhume.audit(model, (x, y), unseen if unseen_y is None else (unseen, unseen_y), loss=cfg.loss, weight_decay=cfg.weight_decay,
                        normalize=parse_normalize(cfg.normalize), max_seconds=seconds, attack_args=attack_args,
                        out=out, seed=seed, progress=False, force=True, **extra)


def row_of(victim: str, method: str, seed: int, seconds: float, wall: float, result) -> dict[str, Any]:
    """The numbers of one audit, as a results row."""
    m, s = result.metrics, result.reconstruction.summary or {}
    return {"victim": victim, "method": method, "seed": seed, "budget_s": seconds, "wall_s": round(wall, 1),
            "attack_s": s.get("seconds"), "iterations": s.get("iterations_per_restart") or s.get("iterations"),
            "restarts": s.get("restarts", 1), "memorised": m.get("memorised"), "n_train": m.get("n_train"),
            "control": m.get("memorised_control"), "control_size": m.get("control_size"),
            "control_oracle": m.get("memorised_control_oracle"), "one_to_one": m.get("one_to_one_ssim>=0.4"),
            "one_to_one_control": m.get("one_to_one_ssim>=0.4_control"), "verdict": result.verdict, "p_value": m.get("p_value"),
            "stationarity_residual": (m.get("victim") or {}).get("stationarity_residual"), "reason": result.reason, **owner_columns(m)}


def owner_columns(m) -> dict[str, Any]:
    """The audit's identifiability and membership-from-the-weights numbers (metrics.json), as results columns."""
    ident, exposure = m.get("identifiability") or {}, m.get("membership_exposure") or {}
    row = {"residual_at_training": ident.get("residual_at_training"), "attack_best_residual": ident.get("attack_best_residual"),
           "attack_to_truth": ident.get("attack_to_truth"), "n_nonmembers": exposure.get("n_nonmembers")}
    for name, s in (exposure.get("scores") or {}).items():
        row[f"{name}_auc"] = [s["auc"]["value"], *s["auc"]["ci95"]]
        row[f"{name}_tpr1"] = [s["tpr_at_0.01_fpr"]["value"], *s["tpr_at_0.01_fpr"]["ci95"]]
        row[f"{name}_tpr01"] = [s["tpr_at_0.001_fpr"]["value"], *s["tpr_at_0.001_fpr"]["ci95"]]
    return row


def job(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    folder, result_file = Path(args.victim), Path(args.result)
    t0 = time.perf_counter()
    result = run_audit(folder, args.method, args.seconds, args.seed, result_file.parent.parent / "audits" / result_file.stem)
    row = row_of(folder.name, args.method, args.seed, args.seconds, time.perf_counter() - t0, result)
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.write_text(json.dumps(row, default=str))
    print(json.dumps(row, default=str), flush=True)


def victims(zoo: Path, only: list[str] | None) -> list[str]:
    """The victims to audit: ``only``, or those listed in ``zoo/READY`` (else every folder with an audit.toml)."""
    if only:
        return only
    ready = zoo / "READY"
    if ready.is_file():
        return [n for n in ready.read_text().split() if n]
    return sorted({p.parent.name for pattern in ("*/audit.toml", "*/victim.json") for p in zoo.glob(pattern)})


def run_all(args) -> None:
    out, zoo = Path(args.out), Path(args.zoo)
    me = [sys.executable, str(Path(__file__).resolve())]
    jobs = []
    for name in victims(zoo, args.only):  # the methods side by side on each victim, so that a noisy spell hits both
        for method in args.methods:
            tag = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in method)[:80]
            result = out / "results" / f"{name}__{tag}__s{args.seed}.json"
            if not result.exists():
                jobs.append(me + ["job", "--victim", str(zoo / name), "--method", method, "--seconds", str(args.seconds),
                                  "--seed", str(args.seed), "--result", str(result)])
    t0 = time.perf_counter()
    zoo_parallel()(jobs, args.slots, args.cores_per_job, out / "log.txt", args.first_core)
    print(f"ran {len(jobs)} jobs in {time.perf_counter() - t0:.0f} s", flush=True)
    table(args)


def fmt_row(r: dict) -> str:
    its = r["iterations"]
    its = "+".join(str(i) for i in its) if isinstance(its, list) else str(its)
    stat = "–" if r["stationarity_residual"] is None else f"{r['stationarity_residual']:.3f}"
    p = "–" if r["p_value"] is None else f"{r['p_value']:.2g}"
    return (f"| {r['victim']} | {r['method']} | {r['memorised']} / {r['n_train']} | {r['control']} / {r['control_size']} "
            f"| {r['control_oracle']} | {r['one_to_one']} | {r['verdict']} (p {p}) | {stat} | {its} | {r['attack_s']} |")


def table(args) -> None:
    out = Path(args.out)
    rows = [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]
    if not rows:
        print(f"no results in {out / 'results'}")
        return
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ROW_KEYS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    lines = ["| victim | method | memorised | control | control (ORACLE) | one-to-one ≥ 0.4 | verdict | stationarity "
             "| iterations | attack s |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [fmt_row(r) for r in rows]
    reasons = [f"- {r['victim']} × {r['method']}: {r['reason']}" for r in rows]
    text = (f"budget {sorted({r['budget_s'] for r in rows})} s per audit; stationarity: the audit's relative stationarity "
            "residual on the training data\n\n" + "\n".join(lines) + "\n\nreasons:\n\n" + "\n".join(reasons) + "\n")
    (out / "table.md").write_text(text)
    print(text)


PIVOT_METHODS = {"default": "weights only: default", "start": "known start (owner: start, settings, Adam state)",
                 "start-only": "known start (public start alone)", "loo": "Loo et al. reference (start known)",
                 "simulate": "known start, simulated training (owner)"}


def pivot_cell(r: dict | None) -> str:
    """memorised / control · one-to-one ≥ 0.4 · verdict, p · the residual the audit checked."""
    if r is None:
        return "—"
    verdict = {"leaks": "**leaks**", "no evidence": "no evidence", "inconclusive": "inconcl."}[r["verdict"]]
    p = "" if r["p_value"] is None else f", p {r['p_value']:.2g}"
    stat = "–" if r["stationarity_residual"] is None else f"{r['stationarity_residual']:.2f}"
    return f"{r['memorised']} / {r['control']} · {r['one_to_one']} · {verdict}{p} · {stat}"


def pivot(args) -> None:
    """One row per victim, one column per method (the known-start table of benchmarks/notes/2026-11-27-known-start-audits.md), and the totals."""
    rows = [json.loads(p.read_text()) for p in sorted((Path(args.out) / "results").glob("*.json"))]
    by = {(r["victim"], r["method"]): r for r in rows}
    names = list(dict.fromkeys(r["victim"] for r in rows))
    methods = [m for m in PIVOT_METHODS if any(k[1] == m for k in by)]
    lines = ["| victim (n) | " + " | ".join(PIVOT_METHODS[m] for m in methods) + " |", "|---|" + "---|" * len(methods)]
    for v in names:
        n = next(r["n_train"] for (name, _), r in by.items() if name == v)
        lines.append(f"| {v} ({n}) | " + " | ".join(pivot_cell(by.get((v, m))) for m in methods) + " |")
    for m in methods:
        got = [r for (_, mm), r in by.items() if mm == m]
        lines.append(f"\n{m}: memorised {sum(r['memorised'] for r in got)}, control {sum(r['control'] for r in got)}, "
                     f"leaks {sum(r['verdict'] == 'leaks' for r in got)} of {len(got)}")
    print("\n".join(lines))


def fits(args) -> None:
    """The equation at the truth against the attack's fit, as each audit measured it (EVALUATOR-SIDE; metrics.json's
    ``identifiability``, :mod:`exhume.evaluation.identifiability`): where the attack's candidates explain the weights
    better than the training images do, more descent on this equation cannot find them."""
    lines = ["| victim | method | residual at the training images | attack's best residual | attack / truth | memorised |",
             "|---|---|---:|---:|---:|---|"]
    for result in sorted((Path(args.out) / "results").glob("*.json")):
        r = json.loads(result.read_text())
        if r.get("attack_to_truth") is None:
            continue
        lines.append(f"| {r['victim']} | {r['method']} | {r['residual_at_training']:.3f} | {r['attack_best_residual']:.3f} | "
                     f"{r['attack_to_truth']:.2f} | {r['memorised']} / {r['n_train']} |")
    print("\n".join(lines))


def membership(args) -> None:
    """Membership from the weights, per audit: AUC and TPR at 1 % / 0.1 % FPR with their 95 % intervals (EVALUATOR-SIDE)."""
    names = ("loss", "loss_drop", "gradient_alignment", "gradient_alignment_start")
    lines = ["| victim | method | members / unseen | " + " | ".join(f"{n}: AUC · TPR@1% · TPR@0.1%" for n in names) + " |",
             "|---|---|---|" + "---|" * len(names)]

    def cell(r, n):
        if r.get(f"{n}_auc") is None:
            return "–"
        a, t1, t01 = r[f"{n}_auc"], r[f"{n}_tpr1"], r[f"{n}_tpr01"]
        return f"{a[0]:.2f} [{a[1]:.2f}, {a[2]:.2f}] · {100 * t1[0]:.1f} % [{100 * t1[1]:.1f}, {100 * t1[2]:.1f}] · {100 * t01[0]:.1f} %"

    for result in sorted((Path(args.out) / "results").glob("*.json")):
        r = json.loads(result.read_text())
        if r.get("n_nonmembers") is None:
            continue
        lines.append(f"| {r['victim']} | {r['method']} | {r['n_train']} / {r['n_nonmembers']} | "
                     + " | ".join(cell(r, n) for n in names) + " |")
    print("\n".join(lines))


def owner(args) -> None:
    """One row per audit: the verdict, its reconstruction count, identifiability and the membership finding, side by side
    (EVALUATOR-SIDE; the three findings of each audit's summary), then the totals per method."""
    rows = [json.loads(p.read_text()) for p in sorted((Path(args.out) / "results").glob("*.json"))]

    def tpr(r, n):
        t = r.get(f"{n}_tpr1")
        return "–" if t is None else f"{100 * t[0]:.1f} % [{100 * t[1]:.1f}, {100 * t[2]:.1f}]"

    def ident(r):
        if r.get("attack_to_truth") is None:
            return "–"
        return f"{r['residual_at_training']:.3f} / {r['attack_best_residual']:.3f} = {r['attack_to_truth']:.2f}"

    lines = ["| victim | threat model | verdict (p) | memorised / control | truth / attack residual = ratio | "
             "alignment: AUC · TPR@1% [95 % CI] | loss drop: TPR@1% | loss: TPR@1% | iterations |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        auc = r.get("gradient_alignment_auc")
        p = "" if r["p_value"] is None else f" ({r['p_value']:.2g})"
        its = "+".join(map(str, r["iterations"])) if isinstance(r["iterations"], list) else r["iterations"]
        lines.append(f"| {r['victim']} | {PIVOT_METHODS.get(r['method'], r['method'])} | {r['verdict']}{p} | {r['memorised']} / "
                     f"{r['control']} | {ident(r)} | {'–' if auc is None else f'{auc[0]:.2f}'} · {tpr(r, 'gradient_alignment')} | "
                     f"{tpr(r, 'loss_drop')} | {tpr(r, 'loss')} | {its} |")
    for m in dict.fromkeys(r["method"] for r in rows):
        got = [r for r in rows if r["method"] == m]
        below = sum(r.get("attack_to_truth") is not None and r["attack_to_truth"] < 1 for r in got)
        exposed = sum((r.get("gradient_alignment_tpr1") or [0, 0, 0])[1] > 0.01 for r in got)
        lines.append(f"\n{m}: {len(got)} audits, leaks {sum(r['verdict'] == 'leaks' for r in got)}, memorised "
                     f"{sum(r['memorised'] for r in got)} against control {sum(r['control'] for r in got)}; the attack fits "
                     f"better than the training images in {below}; membership exposed (alignment's 1 %-FPR interval above 1 %) "
                     f"in {exposed}")
    print("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("zoo", help="the built zoo (build.py's OUT)")
    a.add_argument("--out", default="runs/practitioner")
    a.add_argument("--methods", nargs="+", default=["default"])
    a.add_argument("--only", nargs="+", default=None)
    a.add_argument("--seconds", type=float, default=180.0)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--slots", type=int, default=1)
    a.add_argument("--cores-per-job", type=int, default=2)
    a.add_argument("--first-core", type=int, default=0, help="leave the cores below this one free")
    j = sub.add_parser("job")
    for k in ("--victim", "--method", "--result"):
        j.add_argument(k, required=True)
    j.add_argument("--seconds", type=float, required=True)
    j.add_argument("--seed", type=int, default=0)
    j.add_argument("--threads", type=int, default=1)
    for name in ("table", "pivot", "fits", "membership", "owner"):
        sub.add_parser(name).add_argument("--out", default="runs/practitioner")
    args = ap.parse_args(argv)
    {"all": run_all, "job": job, "table": table, "pivot": pivot, "fits": fits, "membership": membership,
     "owner": owner}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
