"""Milliseconds per kkt-attack iteration: exhume's torch.func path beside a plain autograd reference.

One iteration is what one optimisation step of the attack needs: the stationarity residual
``‖θ − Σ_j λ_j ∇_θ margin_j‖²`` (ReLU derivative replaced by ``sigmoid(α·z)``) and its backward
pass to the candidates ``x`` and the multipliers ``λ`` (a double backward through the network).
The optimiser update, the dual and prior penalties are not included (they are elementwise and cheap).

* exhume: ``exhume.attacks.stationarity.stationarity_residual`` (``torch.func.grad`` of
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
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from exhume.attacks.stationarity import stationarity_residual
from exhume.attacks.surrogate import soft_relu
from exhume.models import MLP

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only 784-256-256-1, m=200, float32")
    ap.add_argument("--repeats", type=int, default=5, help="timed iterations per configuration (median reported)")
    ap.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) first (default: torch's own default; on a machine shared with "
                         "other busy processes, fewer threads than cores can be much faster)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)

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
