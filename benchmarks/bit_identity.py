"""Are two revisions of exhume bit-identical on real victims? Same attack, same seed, same iterations.

Checks out each revision in a detached git worktree (under ``--scratch``), runs ``python -m exhume
attack VICTIM --iterations N --seed S`` there with each setting below, and compares the sha256 of
every tensor of ``reconstruction.safetensors`` (candidates, labels, scores, provenance). A
refactoring that claims "results unchanged" is held to this: equal hashes, not close numbers.
Iterations, not seconds, bound each run, so the load of the machine does not enter the result.

    python benchmarks/bit_identity.py REV_A REV_B VICTIM [VICTIM ...] --scratch /tmp/bitid [-p trace=off]
        [--start-weights VICTIM_NAME=FILE]      # the known start of one victim (--start-weights of exhume attack)

``-p KEY=VALUE`` goes to every attack (``trace=off`` to compare with a revision before 2026-11-27's
trace rule, whose switch to the traced step came after 5 s by the clock).

Exit status 1 when any hash differs. Results: ``benchmarks/notes/2026-11-27-bit-identity.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

SETTINGS = {  # name: extra arguments of `exhume attack`
    "one run, 200 iterations": ["--iterations", "200", "--restarts", "1"],
    "portfolio, 2 restarts x 100 iterations, 1 worker": ["--iterations", "100", "--restarts", "2", "--workers", "1"],
}


def _tree(repo: Path, rev: str, scratch: Path) -> Path:
    """A detached worktree of ``rev`` (reused when it is there)."""
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", rev], check=True, capture_output=True, text=True).stdout.strip()
    tree = scratch / f"tree-{sha[:12]}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), sha], check=True, capture_output=True)
    return tree


def _hashes(run: Path) -> dict[str, str]:
    tensors = load_file(str(run / "reconstruction.safetensors"))
    return {k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()[:16] for k, v in sorted(tensors.items())}


def _attack(tree: Path, victim: Path, out: Path, extra: list[str], seed: int) -> dict[str, str]:
    """``exhume attack`` of the revision checked out in ``tree``; the hashes of what it saved."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "exhume", "attack", str(victim), "-o", str(out), "--seed", str(seed), "--no-progress",
           "--force", *extra]
    subprocess.run(cmd, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    return _hashes(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("victims", nargs="+", type=Path)
    ap.add_argument("--scratch", type=Path, required=True, help="folder for the worktrees and the runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="an attack parameter for every run")
    ap.add_argument("--start-weights", action="append", default=[], metavar="VICTIM_NAME=FILE",
                    help="attack the victim of that folder name with this known start")
    args = ap.parse_args(argv)
    starts = dict(kv.split("=", 1) for kv in args.start_weights)
    repo = Path(__file__).resolve().parents[1]
    args.scratch.mkdir(parents=True, exist_ok=True)
    trees = {rev: _tree(repo, rev, args.scratch) for rev in (args.rev_a, args.rev_b)}
    same = True
    print(f"| victim | setting | tensors | {args.rev_a} | {args.rev_b} | equal |\n|---|---|---|---|---|---|")
    for victim in args.victims:
        for name, extra in SETTINGS.items():
            extra = [*extra, *(a for kv in args.param for a in ("-p", kv))]
            if victim.name in starts:
                extra += ["--start-weights", str(Path(starts[victim.name]).resolve())]
            got = {rev: _attack(tree, victim.resolve(), args.scratch / f"{victim.name}-{rev}-{len(extra)}", extra, args.seed)
                   for rev, tree in trees.items()}
            a, b = got[args.rev_a], got[args.rev_b]
            equal = a == b
            same &= equal
            print(f"| {victim.name} | {name} | {len(a)} | {a.get('candidates')} | {b.get('candidates')} | {'yes' if equal else 'NO'} |",
                  flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
