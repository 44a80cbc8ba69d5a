"""Milliseconds per kkt-attack iteration: exhume's torch.func path beside a plain autograd reference.

One iteration is what one optimisation step of the attack needs: the stationarity residual
``‖θ − Σ_j λ_j ∇_θ margin_j‖²`` (ReLU derivative replaced by ``sigmoid(α·z)``) and its backward
pass to the candidates ``x`` and the multipliers ``λ`` (a double backward through the network).
The optimiser update, the dual and prior penalties are not included (they are elementwise and cheap).

* exhume: ``exhume.equations.stationarity.stationarity_residual`` (``torch.func.grad`` of
  ``Σ λ_j margin(functional_call(model, p, x), y)`` inside ``soft_activations(α)``).
* reference: written here, without exhume: a hand-written forward of the same bias-free MLP with
  ``soft_relu``, ``torch.autograd.grad(Σ λ_j y_j out_j, params, create_graph=True)``, the same
  residual, then backward.

Both backward passes are restricted to ``inputs=[x, λ]`` (in exhume's path the weights do not
require grad anyway; in the reference they must, for ``autograd.grad``, and an unrestricted
``backward`` would also accumulate a gradient into them, which the attack never needs).

Before timing, the two are checked to agree (relative 1e-5 on the loss; the gradients to ``x``
and ``λ`` are reported and checked with a dtype-dependent tolerance). Then 2 warm-up iterations
and the median of ``--repeats`` timed ones; the two paths alternate within every round, so that a
change of load on a shared machine hits both alike.

    python benchmarks/bench_iteration.py                 # all 8 configurations
    python benchmarks/bench_iteration.py --quick         # 784-256-256-1, m=200, float32 only
    python benchmarks/bench_iteration.py --json runs/bench_iteration.json
    python benchmarks/bench_iteration.py --threads 1     # e.g. when other jobs share the cores

``--kkt`` times whole kkt steps instead (the loss of every term, its backward, Adam, the iterate
average; ``KKTAttack.stepper``) on a CNN and three MLPs, side by side on the paths that give equal
results: ``main`` (the surrogate ReLU as the composite ``relu(z).detach() + s − s.detach()``, the
code before the one-node surrogate; eager), ``double-backward`` and ``jvp`` (kkt's
``mixed_derivative``, eager), ``traced`` (the double backward traced once and replayed, kkt's
default) and for the CNN ``traced`` with the weights in channels-last memory format. Each path
runs its own attack from the same start; the paths alternate in rounds of ``--block`` steps, and
one step's loss and gradients are checked equal to ``main``'s first. The attack loop's heap setting
(:func:`exhume.heap.retained_heap`) is process-wide, so it is left out here (measured whole-process
in ``benchmarks/notes/2026-11-27-cnn-speed.md``). ``--compile`` times the stationarity term's value and gradients
eager, traced (``make_fx``, as kkt replays it) and compiled (``torch.compile`` of the traced graph,
inductor): trace and compile seconds, CPU ms per call.

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/bench_iteration.py --kkt --threads 1
    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/bench_iteration.py --compile --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from exhume.attacks.engine.loop import make_optimizer
from exhume.attacks.engine.snapshots import IterateTracker
from exhume.attacks.kkt import KKTAttack
from exhume.equations import surrogate
from exhume.equations.stationarity import residual_value_and_gradients, stationarity_residual, stationarity_residual_and_objective
from exhume.equations.surrogate import soft_relu
from exhume.models import MLP
from exhume.models.builders import build_model
from exhume.victim import AttackerView

ALPHA = 19.0  # the kkt attack's default surrogate sharpness
ARCHS = {"784-1000-1000-1": (1000, 1000), "784-256-256-1": (256, 256)}
MS = (200, 1000)
DTYPES = {"float32": torch.float32, "float64": torch.float64}
LOSS_RTOL = 1e-5
GRAD_RTOL = {"float32": 1e-3, "float64": 1e-9}


# --------------------------------------------------------------------------------------------
# the plain reference (no torch.func, no TorchFunctionMode, no exhume code except soft_relu)
def reference_residual(weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, lam: torch.Tensor,
                       alpha: float) -> torch.Tensor:
    """``‖θ − Σ_j λ_j ∇_θ (y_j Φ(x_j))‖²`` for a bias-free ReLU MLP given as its weight list."""
    h = x.flatten(1)
    for i, w in enumerate(weights):
        h = h @ w.T
        if i < len(weights) - 1:
            h = soft_relu(h, alpha)
    out = h.squeeze(-1)
    g = torch.autograd.grad((lam * y * out).sum(), weights, create_graph=True)
    return sum(((w - gw) ** 2).sum() for w, gw in zip(weights, g))


# --------------------------------------------------------------------------------------------
def make_problem(widths: tuple[int, ...], m: int, dtype: torch.dtype, seed: int = 0):
    torch.manual_seed(seed)
    model = MLP(784, widths, out_features=1, bias=False, first_init_scale=1e-4).to(dtype).eval()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed + 1)
    x0 = torch.randn(m, 1, 28, 28, generator=gen, dtype=dtype) * 0.3  # centred-pixel scale
    lam0 = torch.rand(m, generator=gen, dtype=dtype) * 0.1
    y = torch.cat([torch.ones(m - m // 2), -torch.ones(m // 2)]).to(dtype)
    return model, params, x0, lam0, y


def exhume_step(model, params, x, lam, y) -> torch.Tensor:
    loss = stationarity_residual(model, params, x, y, lam, ALPHA)
    loss.backward(inputs=[x, lam])
    return loss


def reference_step(weights, x, lam, y) -> torch.Tensor:
    loss = reference_residual(weights, x, y, lam, ALPHA)
    loss.backward(inputs=[x, lam])
    return loss


def leaves(x0: torch.Tensor, lam0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x0.clone().requires_grad_(), lam0.clone().requires_grad_()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def check_agreement(model, params, weights, x0, lam0, y, dtype_name: str) -> dict[str, float]:
    xa, la = leaves(x0, lam0)
    loss_a = exhume_step(model, params, xa, la, y).detach()
    xb, lb = leaves(x0, lam0)
    loss_b = reference_step(weights, xb, lb, y).detach()
    out = {
        "loss_rel_err": abs(float(loss_a) - float(loss_b)) / abs(float(loss_b)),
        "grad_x_rel_err": rel_err(xa.grad, xb.grad),
        "grad_lam_rel_err": rel_err(la.grad, lb.grad),
    }
    if not out["loss_rel_err"] <= LOSS_RTOL:
        raise SystemExit(f"exhume and the reference disagree on the loss: {float(loss_a)!r} vs {float(loss_b)!r} "
                         f"(relative {out['loss_rel_err']:.2e} > {LOSS_RTOL:g})")
    tol = GRAD_RTOL[dtype_name]
    for k in ("grad_x_rel_err", "grad_lam_rel_err"):
        if not out[k] <= tol:
            raise SystemExit(f"exhume and the reference disagree: {k} = {out[k]:.2e} > {tol:g}")
    return out


def time_pair(steps, x0, lam0, repeats: int, warmup: int = 2) -> list[list[float]]:
    """Milliseconds per call of each step; the steps alternate within every round, so that a
    change of load on a shared machine hits both alike. The first ``warmup`` rounds are dropped."""
    times: list[list[float]] = [[] for _ in steps]
    for i in range(warmup + repeats):
        for k, step in enumerate(steps):
            x, lam = leaves(x0, lam0)
            t = time.perf_counter()
            step(x, lam)
            dt = time.perf_counter() - t
            if i >= warmup:
                times[k].append(dt * 1000.0)
    return times


def run_case(arch: str, m: int, dtype_name: str, repeats: int) -> dict:
    dtype = DTYPES[dtype_name]
    model, params, x0, lam0, y = make_problem(ARCHS[arch], m, dtype)
    weights = [p.clone().requires_grad_() for p in params.values()]
    agree = check_agreement(model, params, weights, x0, lam0, y, dtype_name)
    t_ex, t_ref = time_pair([lambda x, lam: exhume_step(model, params, x, lam, y),
                             lambda x, lam: reference_step(weights, x, lam, y)], x0, lam0, repeats)
    ex, ref = statistics.median(t_ex), statistics.median(t_ref)
    return {"arch": arch, "m": m, "dtype": dtype_name, "exhume_ms": ex, "reference_ms": ref, "ratio": ex / ref,
            "exhume_ms_all": t_ex, "reference_ms_all": t_ref, **agree}


# --------------------------------------------------------------------------------------------
# --kkt: whole kkt steps on the paths that give equal results
STEP_VICTIMS = {  # name: (architecture, task, classes); 28×28 inputs, m = 200 candidates (n guessed 100)
    "cnn:16;fc=256;pool=avg": ("cnn:16;fc=256;pool=avg", "binary", None),
    "784-256-256-1": ("mlp:256,256;bias=none;init=1e-4", "binary", None),
    "784-256-256-10": ("mlp:256,256;bias=none;init=1e-4", "multiclass", 10),
    "784-1000-1000-1": ("mlp:1000,1000;bias=first;init=1e-4", "binary", None),  # activations above the one-node threshold
}
STEP_PATHS = {  # name: (kkt's mixed_derivative, its trace, channels-last weights, the composite surrogate of main)
    "main": ("double-backward", "off", False, True),
    "double-backward": ("double-backward", "off", False, False),
    "traced": ("double-backward", "auto", False, False),
    "jvp": ("jvp", "off", False, False),
    "traced/channels-last": ("double-backward", "auto", True, False),
}


@contextmanager
def composite_surrogate(on: bool):
    """The surrogate ReLU as main computes it (stock operations), for the ``main`` path."""
    saved = surrogate.soft_relu
    if on:
        surrogate.soft_relu = surrogate.soft_relu_composite
    try:
        yield
    finally:
        surrogate.soft_relu = saved


def step_view(name: str) -> AttackerView:
    """A victim of this architecture with seeded random weights (a step's cost does not depend on them)."""
    spec, task, classes = STEP_VICTIMS[name]
    torch.manual_seed(0)
    model = build_model(spec, (1, 28, 28), classes or 1).eval()
    return AttackerView(model=model, task=task, input_shape=(1, 28, 28), mean=torch.full((1, 28, 28), 0.13),
                        loss="logistic" if task == "binary" else "cross-entropy", weight_decay=5e-3,
                        num_classes=classes, n_train_hint=100)


class StepRunner:
    """One kkt attack on ``view`` along one of :data:`STEP_PATHS`, stepped a block at a time."""

    def __init__(self, view: AttackerView, path: str, dtype: str) -> None:
        mixed, trace, channels_last, self.composite = STEP_PATHS[path]
        self.attack = KKTAttack(mixed_derivative=mixed, trace=trace, dtype=dtype)
        self.p = self.attack.problem(view, torch.device("cpu"), 0, None)
        if channels_last:
            self.p.params = {k: v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v
                             for k, v in self.p.params.items()}
        cfg = self.attack.config
        opts = (make_optimizer(cfg["optimizer"], [self.p.x], cfg["lr"]), make_optimizer(cfg["optimizer"], [self.p.u], self.p.lr_lambda))
        tracker = IterateTracker({"x": self.p.x, "u": self.p.u}, cfg["average_decay"], cfg["snapshot_every"], cfg["keep"])
        self.step = self.attack.stepper(self.p, opts, [], tracker)
        self.done = 0

    def gradients(self) -> tuple[torch.Tensor, ...]:
        """The loss and its gradients in x and u at the current iterate (no step taken)."""
        x, u = self.p.x.detach().clone().requires_grad_(), self.p.u.detach().clone().requires_grad_()
        with composite_surrogate(self.composite):
            loss = self.attack.terms(self.p, x, u)[0]
        loss.backward()
        return loss.detach(), x.grad, u.grad

    def block(self, steps: int) -> tuple[float, float]:
        """Wall and CPU milliseconds per step over ``steps`` steps."""
        with composite_surrogate(self.composite):
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                self.done += 1
                self.step(self.done, False, lambda: float("inf"))  # the default iterations: a long run, traced from the first step
            return 1000 * (time.perf_counter() - wall) / steps, 1000 * (time.thread_time() - cpu) / steps


def step_case(name: str, dtype: str, rounds: int, block: int) -> list[dict]:
    view = step_view(name)
    paths = [p for p in STEP_PATHS if "channels-last" not in p or name.startswith("cnn")]
    runners = {p: StepRunner(view, p, dtype) for p in paths}
    ref = runners["main"].gradients()
    tol = GRAD_RTOL[dtype]
    agree = {}
    for p, r in runners.items():
        got = r.gradients()
        agree[p] = max(abs(float(got[0] - ref[0])) / abs(float(ref[0])), rel_err(got[1], ref[1]), rel_err(got[2], ref[2]))
        if agree[p] > tol:
            raise SystemExit(f"{name}: path {p} disagrees with main: relative {agree[p]:.2e} > {tol:g}")
    for r in runners.values():
        r.block(2)  # warm-up
    times: dict[str, list[tuple[float, float]]] = {p: [] for p in paths}
    for _ in range(rounds):
        for p, r in runners.items():
            times[p].append(r.block(block))
    main_wall, main_cpu = (statistics.median(t[i] for t in times["main"]) for i in (0, 1))
    return [{"victim": name, "path": p, "dtype": dtype, "m": runners[p].p.m, "agree_rel": agree[p],
             "wall_ms_min": min(t[0] for t in ts), "wall_ms_median": statistics.median(t[0] for t in ts),
             "cpu_ms_median": statistics.median(t[1] for t in ts),
             "speedup_vs_main": main_wall / statistics.median(t[0] for t in ts),
             "cpu_speedup_vs_main": main_cpu / statistics.median(t[1] for t in ts),
             "wall_ms_all": [t[0] for t in ts], "cpu_ms_all": [t[1] for t in ts]}
            for p, ts in times.items()]


def print_steps(results: list[dict]) -> None:
    print("| victim | path | m | dtype | wall ms/step min | median | main / path (wall) | CPU ms/step median | "
          "main / path (CPU) | steps in 90 s (wall median) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['victim']} | {r['path']} | {r['m']} | {r['dtype']} | {r['wall_ms_min']:.1f} | {r['wall_ms_median']:.1f} | "
              f"{r['speedup_vs_main']:.2f} | {r['cpu_ms_median']:.1f} | {r['cpu_speedup_vs_main']:.2f} | "
              f"{90_000 / r['wall_ms_median']:.0f} |")


# --------------------------------------------------------------------------------------------
# --compile: the stationarity term's value and gradients eager, traced (kkt's replay) and compiled
def eager_residual(p, alpha: float):
    """kkt's eager double-backward path on the same problem: value and gradients in x and λ."""

    def f(x, lam, params, target, y):
        x, lam = x.clone().requires_grad_(), lam.clone().requires_grad_()
        v, h = stationarity_residual_and_objective(p.model, params, x, y, lam, alpha, p.form.objective, target)
        v.backward()
        return v.detach(), h.detach(), x.grad, lam.grad

    return f


def compile_case(name: str, dtype: str, rounds: int) -> dict:
    from torch.fx.experimental.proxy_tensor import make_fx

    attack = KKTAttack(dtype=dtype)
    p = attack.problem(step_view(name), torch.device("cpu"), 0, None)
    args = (p.x.detach(), (p.form.scale * p.u).detach(), p.params, p.target if p.target is not None else p.params, p.y)
    f = residual_value_and_gradients(p.model, p.form.objective, attack.config["alpha"])
    t = time.perf_counter()
    fns = {"eager": eager_residual(p, attack.config["alpha"]), "traced": make_fx(f, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)}
    seconds = {"trace": time.perf_counter() - t}
    for cache in ("cold", "warm"):  # an empty inductor cache, then the one the first compile filled
        torch._dynamo.reset()
        t = time.perf_counter()
        fns["compiled"] = torch.compile(fns["traced"], dynamic=False)
        fns["compiled"](*args)
        seconds[cache] = time.perf_counter() - t
    ref = fns["eager"](*args)
    agree = {}
    for k in ("traced", "compiled"):
        got = fns[k](*args)
        agree[k] = max(abs(float(got[0] - ref[0])) / abs(float(ref[0])), rel_err(got[2], ref[2]), rel_err(got[3], ref[3]))
        if agree[k] > GRAD_RTOL[dtype]:
            raise SystemExit(f"{name}: {k} disagrees with the eager path: relative {agree[k]:.2e}")
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds + 1):
        for k, fn in fns.items():
            c = time.thread_time()
            fn(*args)
            times[k].append(1000 * (time.thread_time() - c))
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    # the budget at which the cold compile has paid against the replay: B / e = (B − C) / c, so B = C·e / (e − c)
    e, c = med["traced"], med["compiled"]
    return {"victim": name, "dtype": dtype, "trace_s": seconds["trace"], "compile_s_cold": seconds["cold"],
            "compile_s_warm": seconds["warm"], "agree_traced": agree["traced"], "agree_compiled": agree["compiled"],
            **{f"{k}_cpu_ms_median": v for k, v in med.items()}, "break_even_s": seconds["cold"] * e / (e - c) if e > c else None,
            **{f"{k}_cpu_ms_all": v[1:] for k, v in times.items()}}


def main_paths(args) -> int:
    """``--kkt`` and ``--compile``: print the tables, write ``--json``."""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; python {platform.python_version()} on "
          f"{platform.machine()}; {args.dtype}; {args.rounds} rounds" + (f" of {args.block} steps per path" if args.kkt else ""))
    out: dict[str, list] = {"kkt": [], "compile": []}
    if args.kkt:
        for name in args.victims:
            out["kkt"] += step_case(name, args.dtype, args.rounds, args.block)
            print(f"  {name}: done", flush=True)
        print_steps(out["kkt"])
    if args.compile:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench_inductor_"))
        print(f"inductor cache: {os.environ['TORCHINDUCTOR_CACHE_DIR']}")
        print("| victim | trace s | compile s (cold cache) | compile s (warm) | CPU ms/call eager | traced | compiled | "
              "budget where the cold compile pays against the replay, s |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name in args.victims:
            r = compile_case(name, args.dtype, args.rounds)
            out["compile"].append(r)
            pays = "never" if r["break_even_s"] is None else f"{r['break_even_s']:.0f}"
            print(f"| {name} | {r['trace_s']:.1f} | {r['compile_s_cold']:.1f} | {r['compile_s_warm']:.1f} | {r['eager_cpu_ms_median']:.1f} | "
                  f"{r['traced_cpu_ms_median']:.1f} | {r['compiled_cpu_ms_median']:.1f} | {pays} |", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": {"torch": torch.__version__, "threads": torch.get_num_threads(),
                                                  "argv": sys.argv[1:]}, **out}, indent=2))
        print(f"results: {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only 784-256-256-1, m=200, float32")
    ap.add_argument("--repeats", type=int, default=5, help="timed iterations per configuration (median reported)")
    ap.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) first (default: torch's own default; on a machine shared with "
                         "other busy processes, fewer threads than cores can be much faster)")
    ap.add_argument("--kkt", action="store_true", help="time whole kkt steps on each path (module docstring)")
    ap.add_argument("--compile", action="store_true", help="time torch.compile of the stationarity term (module docstring)")
    ap.add_argument("--victims", nargs="+", default=list(STEP_VICTIMS), choices=list(STEP_VICTIMS), help="--kkt/--compile victims")
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES), help="--kkt/--compile precision")
    ap.add_argument("--rounds", type=int, default=7, help="--kkt/--compile: rounds (paths alternate within each)")
    ap.add_argument("--block", type=int, default=5, help="--kkt: steps per path per round")
    args = ap.parse_args(argv)
    if min(args.repeats, args.rounds, args.block) < 1:
        ap.error("--repeats, --rounds and --block must be >= 1")
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if args.kkt or args.compile:
        return main_paths(args)

    if args.quick:
        cases = [("784-256-256-1", 200, "float32")]
    else:
        cases = [(a, m, d) for a in ARCHS for m in MS for d in DTYPES]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads (intra-op), "
          f"{torch.get_num_interop_threads()} inter-op; python {platform.python_version()} on {platform.machine()}")
    print(f"alpha {ALPHA:g}; warm-up 2 iterations, median of {args.repeats} (the two paths alternate); "
          f"one iteration = residual forward + backward to x and lambda")
    print()
    results = []
    for arch, m, d in cases:
        r = run_case(arch, m, d, args.repeats)
        results.append(r)
        print(f"  {arch} m={m} {d}: exhume {r['exhume_ms']:.1f} ms, reference {r['reference_ms']:.1f} ms "
              f"(agree: loss {r['loss_rel_err']:.1e}, grad x {r['grad_x_rel_err']:.1e}, grad lambda {r['grad_lam_rel_err']:.1e})",
              flush=True)
    print()
    print("| arch | m | dtype | exhume ms | autograd ref ms | ratio |")
    print("|---|---:|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['arch']} | {r['m']} | {r['dtype']} | {r['exhume_ms']:.1f} | {r['reference_ms']:.1f} | {r['ratio']:.2f} |")
    print()
    print("ratio = exhume / reference (below 1: exhume is faster)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
                "interop_threads": torch.get_num_interop_threads(), "python": platform.python_version(),
                "machine": platform.machine(), "alpha": ALPHA, "warmup": 2, "repeats": args.repeats,
                "argv": sys.argv[1:]}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
