"""An attack's memory estimate against the peak it reaches: ``/usr/bin/time``'s maximum resident set.

Each case runs in a fresh process under ``/usr/bin/time -f %M``: it builds a victim (random
weights: memory does not depend on training), imports what the first optimiser imports, reads its
resident set (``rss0``), asks the attack for its estimate, and runs it for a few steps with an
output folder (so the checkpoint's write is part of the peak). The table compares the estimate
with the peak less ``rss0`` (what the attack added) and the whole process's peak with
``rss0 + estimate``.

    .venv/bin/python benchmarks/memory_estimate.py              # the table of benchmarks/notes/2026-11-27-operations.md
    .venv/bin/python benchmarks/memory_estimate.py --case kkt mlp:1000 1,28,28 200 float32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (method, arch, input shape, candidates (m, or batch_size for generator attacks), dtype, task)
CASES = [
    ("kkt", "mlp:12", "1,28,28", 200, "float32", "binary"),            # 9.4e3 parameters
    ("kkt", "mlp:128", "1,28,28", 200, "float32", "binary"),           # 1.0e5
    ("kkt", "mlp:1000,1000", "1,28,28", 200, "float32", "binary"),     # 1.8e6
    ("kkt", "mlp:4000,1000", "1,28,28", 200, "float32", "binary"),     # 7.1e6
    ("kkt", "mlp:10000", "1,28,28", 200, "float32", "binary"),         # 7.9e6
    ("kkt", "mlp:3000,2000", "3,32,32", 500, "float64", "binary"),     # 1.5e7
    ("kkt", "mlp:1000", "3,32,32", 4000, "float32", "binary"),         # 3.1e6, many candidates
    ("kkt", "cnn:16,32;fc=64", "1,28,28", 200, "float32", "binary"),   # a CNN
    ("kkt", "cnn:32,64;fc=256", "3,32,32", 400, "float32", "binary"),  # a CNN on CIFAR-sized inputs
    ("bilevel", "mlp:12;bias=all", "1,28,28", 100, "float64", "binary"),
    ("bilevel", "mlp:256;bias=all", "1,28,28", 100, "float64", "binary"),
    ("bilevel", "mlp:1000;bias=all", "1,28,28", 100, "float64", "binary"),
    ("bilevel", "mlp:100;bias=all", "3,32,32", 1000, "float64", "binary"),
    ("inversion", "convnet:32,64;fc=128", "1,28,28", 64, "float32", "multiclass"),
    ("tldr", "convnet:32,64;fc=128", "1,28,28", 64, "float32", "multiclass"),
    ("tldr", "convnet:64,128;fc=512", "3,32,32", 128, "float32", "multiclass"),
]


def vm_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def one(method: str, arch: str, shape: str, count: int, dtype: str, task: str) -> dict:
    """Run one case in this process (under /usr/bin/time); returns what it measured."""
    import torch

    import exhume
    from exhume.attacks import get_attack
    from exhume.models import build_model
    from exhume.victim import AttackerView

    input_shape = tuple(int(s) for s in shape.split(","))
    classes = 10 if task == "multiclass" else None
    torch.manual_seed(0)
    model = build_model(arch, input_shape, classes or 1).eval()
    view = AttackerView(model=model, task=task, input_shape=input_shape, mean=torch.full(input_shape, 0.2), loss=None,
                        weight_decay=5e-3, num_classes=classes, n_train_hint=count if method == "bilevel" else count // 2)
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # the first optimiser imports torch's compiler
    if method in ("kkt", "bilevel"):
        kwargs = {"m": count, "dtype": dtype, "iterations": 1 if method == "bilevel" else 3}
        if method == "bilevel":  # one outer step reaches the peak (its Lanczos bases); fewer inner steps keep it short
            kwargs.update(inner_steps=1, cg_iterations=5)
    else:
        kwargs = {"batch_size": count, "steps": 3, "samples_per_class": 10}
    atk = get_attack(method, **kwargs)
    rss0 = vm_rss()
    estimate = atk.peak_memory_bytes(view)
    with tempfile.TemporaryDirectory() as out:
        exhume.attack(view, method=method, out=Path(out) / "run", progress=False, restarts=1, **kwargs)
    return {"method": method, "arch": arch, "input": shape, "count": count, "dtype": dtype,
            "parameters": sum(p.numel() for p in model.parameters()), "rss0": rss0, "estimate": estimate}


def measure(case) -> dict:
    cmd = ["/usr/bin/time", "-f", "maxrss_kb %M", sys.executable, __file__, "--case", *map(str, case)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["maxrss"] = int(proc.stderr.strip().splitlines()[-1].split()[1]) * 1024
    return row


def table(rows: list[dict]) -> str:
    lines = ["| attack | victim | input | m / batch | dtype | parameters | rss0 MiB | peak MiB | added MiB | estimate MiB "
             "| estimate / added | (rss0 + estimate) / peak |", "|" + "---|" * 12]
    for r in rows:
        added = r["maxrss"] - r["rss0"]
        lines.append(f"| {r['method']} | {r['arch']} | {r['input']} | {r['count']} | {r['dtype']} | {r['parameters']:,} "
                     f"| {r['rss0'] / 2**20:.0f} | {r['maxrss'] / 2**20:.0f} | {added / 2**20:.0f} | {r['estimate'] / 2**20:.0f} "
                     f"| {r['estimate'] / max(added, 1):.2f} | {(r['rss0'] + r['estimate']) / r['maxrss']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", nargs=6, metavar=("METHOD", "ARCH", "SHAPE", "COUNT", "DTYPE", "TASK"))
    p.add_argument("--only", default=None, help="run the cases of this attack only")
    args = p.parse_args()
    if args.case:
        m, arch, shape, count, dtype, task = args.case
        print(json.dumps(one(m, arch, shape, int(count), dtype, task)))
        return
    rows = []
    for case in CASES:
        if args.only and case[0] != args.only:
            continue
        rows.append(measure(case))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
