"""Memorised against kkt iterations on the CNN victims: one run's trajectory, judged at each checkpoint.

    V=runs/cnn   # outputs (not in the repository)
    nice -n 15 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python research/cnn_curve.py build digits-cnn-wd5e-3 --out $V
    nice -n 15 env OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python research/cnn_curve.py curve digits-cnn-wd5e-3 --out $V \\
        --seed 0 --checkpoints 500 1000 2000 5000 10000 20000
    python research/cnn_curve.py table --out $V

``build`` trains a victim of the zoo (``benchmarks/zoo/zoo.py``) or :data:`EXTRA` (a Fashion-MNIST CNN with weight
decay) into ``OUT/victims/NAME``. ``curve`` runs ONE kkt restart (``--restarts 1``, a fixed seed, every other setting
the attack's default) in chunks: ``python -m exhume attack VICTIM -o OUT/curves/NAME/run --restarts 1 --iterations K
[--resume]`` up to each checkpoint K, then ``python -m exhume evaluate ... --pool-size 1000`` (the zoo's judging: 1000
unseen pool images, the control of held-out non-members), and appends a row to ``OUT/curves/NAME/curve.jsonl``
(checkpoints already there are skipped, so a stopped curve continues). Each row has the attack's own relative
residual ``‖θ − Σ λ_j ∇θ h(x̂_j)‖² / ‖θ‖²`` (its kept iterate, its multipliers, the exact ReLU derivative) and, at the
same checkpoint, the least-squares best of the same equation over λ ≥ 0 at the returned candidates.

EVALUATOR-SIDE (reads the training images; computed once per victim): the same squared relative residual at the
training images, with λ ≥ 0 fitted by non-negative least squares (the truth's best fit of the attack's equation) and
with the multipliers weight decay implies (λ_i = −ℓ'(h_i)/(n·w)). If the attack's residual falls below the truth's
best while nothing is recovered, more iterations on this equation cannot find the training images (formulation-bound);
if the attack's residual is still above the truth's and memorised grows with iterations, it is compute-bound.
``curve --init ground-truth`` (ORACLE, in ``OUT/oracle/NAME``) starts from the training images instead: does the
attack keep them? ``-p KEY=VALUE`` passes a kkt setting (the folder's name carries it). ``scales`` prints each ReLU's
median |z| at the training images (EVALUATOR-SIDE); ``from-run`` starts new runs at an earlier run's candidates;
``speed`` times one step at α = 19 against ``surrogate=layer-scaled``. Results: benchmarks/README.md, "The CNN row:
memorised against kkt iterations" and "A surrogate relative to each layer's scale".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the repository root: exhume and benchmarks.zoo

from benchmarks.zoo.zoo import BY_NAME, ZooVictim  # noqa: E402

#: a Fashion-MNIST CNN with weight decay, the zoo's CNN architecture and recipe on 28×28 clothing images
EXTRA = {v.name: v for v in (
    ZooVictim("fashion-cnn-wd5e-3", "fashion-mnist", "odd-even", 100, "cnn:16;fc=256;pool=avg", 5e-3, 14, epochs=20_000),
)}
FASHION_ROOT = "/usr/share/datasets/fashion-mnist"


def spec_of(name: str) -> ZooVictim:
    if name in BY_NAME or name in EXTRA:
        return {**BY_NAME, **EXTRA}[name]
    raise SystemExit(f"unknown victim {name!r}; known: {', '.join([*BY_NAME, *EXTRA])}")


def build(args) -> None:
    import torch

    from benchmarks.zoo.zoo import build as build_victim

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    v = build_victim(spec_of(args.name), Path(args.out) / "victims" / args.name, args.fashion_root)
    print(args.name, {k: v.metrics.get(k) for k in ("train_accuracy", "test_accuracy", "epochs", "stationarity_residual")},
          f"{time.perf_counter() - t0:.0f} s", flush=True)


def gradients(model, params, x, y, objective):
    """``G`` (k × p, float64): row j is ``∇θ h(Φ(θ; x_j), y_j)`` with the exact ReLU derivative."""
    import torch

    from exhume.attacks.stationarity import weighted_gradient_and_objective

    rows, hs = [], []
    one = torch.ones(1, dtype=torch.float64)
    for j in range(x.shape[0]):
        g, h = weighted_gradient_and_objective(model, params, x[j:j + 1], y[j:j + 1], one, None, objective)
        rows.append(torch.cat([g[k].reshape(-1) for k in params]))
        hs.append(h.detach())
    return torch.stack(rows), torch.cat(hs)


def nnls_fit(g, theta) -> float:
    """``min_{λ ≥ 0} ‖θ − Gᵀλ‖² / ‖θ‖²`` through the Gram matrix's eigendecomposition."""
    import torch
    from scipy.optimize import nnls

    gram, gt = g @ g.T, g @ theta
    s, v = torch.linalg.eigh(gram)
    keep = s > s.max().clamp_min(0) * 1e-12
    root = s[keep].sqrt()
    r, t = (root[:, None] * v[:, keep].T).numpy(), ((v[:, keep].T @ gt) / root).numpy()
    _, rnorm = nnls(r, t, maxiter=100 * r.shape[1])
    theta2 = float(theta @ theta)
    return float((rnorm**2 + max(theta2 - float((t**2).sum()), 0.0)) / theta2)


def problem(victim):
    """The attack's own equation for ``victim`` (kkt defaults, float64): model, params, θ (or its learned part), h."""
    import torch

    from exhume.attacks import get_attack

    atk = get_attack("kkt", dtype="float64")
    p = atk.problem(victim.attacker_view(), torch.device("cpu"), 0, None)
    target = p.target if p.target is not None else p.params
    theta = torch.cat([target[k].detach().reshape(-1) for k in p.params]).double()
    return p, theta, p.target is not None


def truth_residuals(victim) -> dict:
    """EVALUATOR-SIDE: the attack's equation at the training images (NNLS λ ≥ 0, and weight decay's own λ)."""
    import torch

    p, theta, denoised = problem(victim)
    task = victim.train_set
    x = (task.x.double() - p.mean)
    g, h = gradients(p.model, p.params, x, task.y.double() if task.y.is_floating_point() else task.y, p.form.objective)
    out = {"truth_nnls": nnls_fit(g, theta), "n_train": int(x.shape[0]), "parameters": int(theta.numel()),
           "denoised_target": denoised, "formulation": p.form.name}
    wd, loss = float(victim.weight_decay or 0.0), victim.loss
    if wd > 0 and loss == "logistic" and p.form.name == "margin":
        lam = torch.sigmoid(-h) / (x.shape[0] * wd)
        out["truth_decay_lambda"] = float(((theta - g.T @ lam) ** 2).sum() / (theta @ theta))
    return out


def candidate_residual(victim, run: Path) -> float:
    """The same NNLS fit at the attack's returned candidates (display space, after its background floor)."""

    from exhume.attacks import load_reconstruction

    p, theta, _ = problem(victim)
    recon = load_reconstruction(run)
    x = recon.candidates.double() - p.mean
    y = recon.labels.double() if recon.labels.is_floating_point() else recon.labels
    g, _ = gradients(p.model, p.params, x, y, p.form.objective)
    return nnls_fit(g, theta)


def exhume_cli(*argv: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "exhume", *argv], check=True, env=env, cwd=ROOT)
    return time.perf_counter() - t0


def curve(args) -> None:
    import torch

    from exhume.victim import load_victim

    torch.set_num_threads(1)
    vdir = Path(args.out) / "victims" / args.name
    base = Path(args.out) / ("oracle" if args.init else "curves") / (args.name + "".join(f"~{kv}" for kv in args.param))
    run, rows_file, truth_file = base / "run", base / "curve.jsonl", base / "truth.json"
    base.mkdir(parents=True, exist_ok=True)
    victim = load_victim(vdir)
    if not truth_file.exists():
        truth_file.write_text(json.dumps(truth_residuals(victim)))
    done = {json.loads(line)["checkpoint"] for line in rows_file.read_text().splitlines()} if rows_file.exists() else set()
    for k in args.checkpoints:
        if k in done:
            continue
        resume = ["--resume"] if (run / "checkpoint.pt").exists() else []
        wall = exhume_cli("attack", str(vdir), "-o", str(run), "--restarts", "1", "--seed", str(args.seed), "--iterations", str(k),
                          "--no-progress", *resume, *(["--init", args.init] if args.init else []),
                          *[a for kv in args.param for a in ("-p", kv)])
        ev = run.parent / f"eval-{k}"
        exhume_cli("evaluate", str(run), "--against", str(vdir), "-o", str(ev), "--pool-size", "1000")
        m = json.loads((ev / "metrics.json").read_text())
        s = json.loads((run / "reconstruction.json").read_text())["summary"]
        row = {"victim": args.name, "start": args.init or "noise", "params": args.param, "seed": args.seed, "checkpoint": k, "iterations": s["iterations"],
               "attack_seconds": s["seconds"],
               "chunk_wall_s": round(wall, 1), "kept_iteration": s.get("kept_iteration"), "memorised": m["memorised"],
               "control": m.get("memorised_control"), "one_to_one": m["one_to_one_ssim>=0.4"],
               "attack_residual": s.get("final_relative_stationarity"), "attack_nnls": candidate_residual(victim, run)}
        with rows_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def scales(args) -> None:
    """EVALUATOR-SIDE: each ReLU's median |z| (per image, then the median over images) at the training images."""
    import torch
    from torch.overrides import TorchFunctionMode

    from exhume.attacks.surrogate import _RELUS
    from exhume.victim import load_victim

    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, a=(), kw=None):  # noqa: ANN001
            if func in _RELUS:
                seen.append(a[0].detach().abs().reshape(a[0].shape[0], -1).median(1).values.median().item())
            return func(*a, **(kw or {}))

    for name in args.names:
        victim = load_victim(Path(args.out) / "victims" / name)
        p, _, _ = problem(victim)
        seen.clear()
        with torch.no_grad(), Record():
            p.model(victim.train_set.x.double() - p.mean)
        print(name, "median |z| per ReLU (training images, EVALUATOR-SIDE):", " ".join(f"{v:.4g}" for v in seen), flush=True)


def from_run(args) -> None:
    """A continuation's second stage, emulated: a new lone run (fresh multipliers, ``-p`` settings) started at the
    returned candidates of an earlier run ``--from`` (e.g. the default's); memorised at each checkpoint, each from scratch."""
    import torch

    import exhume
    from exhume.victim import load_victim

    torch.set_num_threads(1)
    victim, prev = load_victim(Path(args.out) / "victims" / args.name), exhume.load_reconstruction(args.source)
    settings = {k: json.loads(v) if v[:1].isdigit() or v[:1] == "-" else v for k, v in (kv.split("=", 1) for kv in args.param)}
    for k in args.checkpoints:
        recon = exhume.attack(victim, "kkt", seed=args.seed, progress=False, iterations=k, restarts=1, init=prev.candidates,
                              init_name="an earlier run's candidates", **settings)
        assert torch.equal(recon.labels, prev.labels)
        m = exhume.evaluate(recon, victim, pool_size=1000, figures=False).metrics
        print(json.dumps({"victim": args.name, "from": str(args.source), "from_iterations": prev.summary["iterations"],
                          "params": args.param, "iterations": k, "memorised": m["memorised"], "control": m["memorised_control"],
                          "residual": recon.summary["final_relative_stationarity"], "seconds": recon.summary["seconds"]}), flush=True)


def speed(args) -> None:
    """ms per traced stationarity step (value, gradients in x̂ and λ) at the default start, α = 19 against layer-scaled
    c = 2, interleaved in one process (median of 10 after 2 warm-up calls)."""
    import torch

    from exhume.attacks.stationarity import TracedResidual
    from exhume.attacks.surrogate import LayerScaled
    from exhume.victim import load_victim

    torch.set_num_threads(1)
    for name in args.names:
        p, _, _ = problem(load_victim(Path(args.out) / "victims" / name))
        x = (p.x.detach() + 0.05 * torch.randn_like(p.x)).requires_grad_()
        lam = (p.form.scale * p.u.detach()).requires_grad_()
        fns = {a: TracedResidual() for a in (19.0, LayerScaled(2.0))}
        times = {a: [] for a in fns}
        for rep in range(12):
            for a, f in fns.items():
                t0 = time.perf_counter()
                f(p.model, p.params, x, p.y, lam, a, p.form.objective, p.target)[0].backward()
                if rep >= 2:
                    times[a].append(time.perf_counter() - t0)
        print(name, f"m={x.shape[0]}", {str(a): f"{1e3 * sorted(t)[len(t) // 2]:.1f} ms" for a, t in times.items()}, flush=True)


def table(args) -> None:
    lines = ["| victim | start | iterations | attack s | memorised / control | one-to-one ≥ 0.4 | attack residual (its λ) | "
             "attack residual (best λ ≥ 0) | truth residual (best λ ≥ 0) † | truth (decay's λ) † |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for base in sorted([*(Path(args.out) / "curves").glob("*"), *(Path(args.out) / "oracle").glob("*")]):
        if not (base / "curve.jsonl").exists():
            continue
        truth = json.loads((base / "truth.json").read_text())
        for line in (base / "curve.jsonl").read_text().splitlines():
            r = json.loads(line)
            decay = truth.get("truth_decay_lambda")
            start, name = r.get("start", "noise"), " ".join([r["victim"], *r.get("params", [])])
            lines.append(f"| {name} | {start if start == 'noise' else start + ' (ORACLE)'} | {r['iterations']:,} | "
                         f"{r['attack_seconds']:.0f} | {r['memorised']} / {r['control']} | "
                         f"{r['one_to_one']} | {r['attack_residual']:.4f} | {r['attack_nnls']:.4f} | {truth['truth_nnls']:.4f} | "
                         f"{'–' if decay is None else f'{decay:.4f}'} |")
    print("\n".join(lines))
    print("\n† EVALUATOR-SIDE: at the training images. Residuals are ‖θ − Σ λ_j ∇θ h_j‖² / ‖θ‖² (squared, relative).")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("name")
    b.add_argument("--out", required=True)
    b.add_argument("--fashion-root", default=FASHION_ROOT)
    c = sub.add_parser("curve")
    c.add_argument("name")
    c.add_argument("--out", required=True)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--checkpoints", type=int, nargs="+", default=[500, 1000, 2000, 5000, 10_000, 20_000])
    c.add_argument("--init", default=None, choices=("ground-truth",),
                   help="ORACLE: start from the training images (m = n), in OUT/oracle/NAME: is the truth a point the attack keeps?")
    c.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a kkt setting other than its default (exhume attack -p; the folder's name carries it)")
    sub.add_parser("table").add_argument("--out", required=True)
    sc = sub.add_parser("scales")
    sc.add_argument("names", nargs="+")
    sc.add_argument("--out", required=True)
    fr = sub.add_parser("from-run")
    fr.add_argument("name")
    fr.add_argument("--from", dest="source", required=True)
    fr.add_argument("--out", required=True)
    fr.add_argument("--seed", type=int, default=0)
    fr.add_argument("--checkpoints", type=int, nargs="+", default=[500])
    fr.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE")
    sp = sub.add_parser("speed")
    sp.add_argument("names", nargs="+")
    sp.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    {"build": build, "curve": curve, "table": table, "scales": scales, "from-run": from_run, "speed": speed}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
