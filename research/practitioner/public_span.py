"""Candidates kept in the span of PUBLIC images: a prior for the known start of a fine-tuned model (not adopted).

    python research/practitioner/public_span.py oracle ZOO VICTIM [--k 30 50 100 200]
    python research/practitioner/public_span.py audit ZOO VICTIM --k 30 [--seconds 180] [--out RUNS]

The attacker of a model fine-tuned from a public checkpoint also has images of the same kind (the
zoo's pre-training block, ``practitioner.data.blocks(...)["pretrain"]``, 5,000 of them). Their top
``k`` principal directions (uncentred: the candidates live around the audit's data mean) give a
span to keep the candidates in, in place of kkt's training-input span (which the CNNs and frozen
heads do not show).

- ``oracle`` (ORACLE: it reads the training images): the training images projected onto that span,
  judged as an attack's candidates: how much a perfect recovery inside the span could memorise.
- ``audit``: the owner's known-start audit (``run.py``'s ``start`` method, the portfolio) with kkt's
  span replaced by this one, by patching ``KKTAttack.span`` in this process (the portfolio's
  workers are forked, so they inherit it). Results in ``RUNS/results`` as ``run.py``'s rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE)]  # the repository root (exhume, benchmarks), research/practitioner/


def public_basis(victim: str, mean: torch.Tensor, k: int, count: int = 5000) -> torch.Tensor:
    """``(d, k)``: the top ``k`` right singular vectors of the victim's public images minus ``mean``."""
    from benchmarks.practitioner import build, data

    spec = build.BY_NAME[victim]
    images, _ = data.dataset(spec.data)
    pub = torch.from_numpy(images[data.blocks(spec.data)["pretrain"][:count]]).double()
    if not len(pub):
        raise SystemExit(f"{victim}: its dataset has no public (pre-training) block")
    _, _, vh = torch.linalg.svd((pub - mean.double()).reshape(len(pub), -1), full_matrices=False)
    return vh[:k].T.contiguous()


def oracle(zoo: Path, victim: str, ks: list[int]) -> None:
    from oracle_features import audited

    import exhume
    from exhume.attacks.base import Reconstruction

    dat, x, y, unseen = audited(zoo / victim)
    mean = dat.view.mean.double()
    xt = torch.as_tensor(x).double()
    for k in ks:
        b = public_basis(victim, mean, k)
        proj = (((xt - mean).reshape(len(xt), -1) @ b) @ b.T).reshape(xt.shape) + mean
        m = exhume.evaluate(Reconstruction("oracle", proj.float(), torch.as_tensor(y), None, {}, 0), train=(x, y), unseen=unseen,
                            figures=False).metrics
        print(json.dumps({"victim": victim, "k": k, "memorised_ORACLE": m["memorised"], "control": m["memorised_control"],
                          "n": len(x)}), flush=True)


def audit(zoo: Path, victim: str, k: int, seconds: float, out: Path) -> None:
    from oracle_features import audited

    from benchmarks.practitioner.run import row_of, run_audit
    from exhume.attacks import kkt
    from exhume.attacks.subspace import Subspace

    basis = public_basis(victim, audited(zoo / victim)[0].view.mean, k)

    def span(self, view, model, params, n, eq, x):
        sp = Subspace(basis, {"subspace_used": f"public images' top {k} directions"})
        with torch.no_grad():
            x.copy_(sp.project(x))
        return sp

    kkt.KKTAttack.span = span
    t0 = time.perf_counter()
    result = run_audit(zoo / victim, "start", seconds, 0, out / "audits" / f"{victim}__start-public{k}")
    row = row_of(victim, f"start-public{k}", 0, seconds, time.perf_counter() - t0, result)
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / f"{victim}__start-public{k}__s0.json").write_text(json.dumps(row, default=str))
    print(json.dumps(row, default=str), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("oracle", "audit"))
    ap.add_argument("zoo")
    ap.add_argument("victim")
    ap.add_argument("--k", type=int, nargs="+", default=[30, 50, 100, 200])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--out", default="runs/public-span")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.mode == "oracle":
        oracle(Path(args.zoo), args.victim, args.k)
    else:
        audit(Path(args.zoo), args.victim, args.k[0], args.seconds, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
