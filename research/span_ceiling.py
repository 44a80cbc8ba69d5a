"""What the span kkt projects onto leaves of the training images, and whether filling the rest helps.

    python research/span_ceiling.py --victim runs/zoo/victims/fashion-256-haim \\
        [--run runs/ceil/fashion-256-haim/default] [--steps 100]

Evaluator-side (reads the training set). For a victim whose weights show a span
(:func:`exhume.attacks.subspace.data_subspace`, read as kkt reads it):

- **ceiling**: every training image projected onto the span (centred by the victim's data mean,
  as kkt centres its candidates) and scored by ``exhume.evaluate`` as if it were a reconstruction:
  how many would still beat their best unseen look-alike. The projection is the in-span image
  nearest to each training image (in L2; SSIM need not agree exactly), so this measures how much
  the projection itself costs, not what an attack finds.
- **completion**: the same images with their out-of-span part filled by the completion that
  minimises a smoothed total variation ``Σ √(∂x² + ∂y² + ε²)`` plus ``RANGE_WEIGHT`` × the
  squared pixel-range penalty (in-span part untouched; ``--steps`` Adam steps at 1e-2), and with
  ``--run R`` (a kkt portfolio folder with ``restarts/<k>/``, e.g. from ``variant_screen.py``) the
  same completion applied to the restarts' pooled candidates (attacker-side: it needs only the
  span and the candidates), against the pool as it is. Also ``--penalty range`` (no smoothness
  term) and ``--penalty tv2`` (squared differences).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from after_pool import score, with_candidates  # noqa: E402  (scoring; a reconstruction with other candidates)

from benchmarks.zoo.run import pooled, restart_results  # noqa: E402
from exhume.attacks import Reconstruction  # noqa: E402
from exhume.attacks.base import attack_model  # noqa: E402
from exhume.attacks.subspace import data_subspace  # noqa: E402
from exhume.victim import load_victim  # noqa: E402

RANGE_WEIGHT = 10.0
TV_EPS = 1e-3


def smoothness(dh: torch.Tensor, dw: torch.Tensor, penalty: str) -> torch.Tensor:
    if penalty == "tv":
        return torch.sqrt(dh**2 + dw**2 + TV_EPS**2).sum()
    if penalty == "tv2":
        return (dh**2 + dw**2).sum()
    return dh.new_zeros(())  # "range": the pixel-range penalty alone


def complete(images: torch.Tensor, basis: torch.Tensor, steps: int, penalty: str = "tv") -> torch.Tensor:
    """``images`` (display space) plus the out-of-span part that minimises the penalty."""
    x0, b = images.double(), basis.double()
    z = torch.zeros(len(x0), b.shape[0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([z], lr=1e-2)

    def filled():
        return x0 + (z - (z @ b) @ b.T).reshape(x0.shape)

    for _ in range(steps):
        x = filled()
        dh, dw = x[..., 1:, :-1] - x[..., :-1, :-1], x[..., :-1, 1:] - x[..., :-1, :-1]
        loss = smoothness(dh, dw, penalty) + RANGE_WEIGHT * (torch.relu(x - 1) ** 2 + torch.relu(-x) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return filled().float()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", required=True)
    ap.add_argument("--run", default=None, help="a kkt portfolio folder whose pooled candidates to complete")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--penalty", choices=("tv", "tv2", "range"), default="tv")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    victim = load_victim(args.victim)
    view = victim.attacker_view()
    model, params = attack_model(view.model, "cpu", torch.float32)
    span = data_subspace(model, params, tuple(view.input_shape), view.n_train_hint or 100)
    if span.basis is None:
        print(f"no span: {span.info.get('subspace_reason')}")
        return 0
    train = victim.load_train_set()
    mean = view.mean.reshape(1, *view.input_shape)
    projected = span.project(train.x - mean) + mean
    truth = Reconstruction(method="projected-training-images", candidates=projected.float(), labels=train.y,
                           scores=None, config={}, seed=0)
    print(f"{Path(args.victim).name}: span rank {span.info['subspace_rank']} (cut by {span.info['subspace_cut_by']})")
    print(f"  training images projected onto the span: {score(truth, victim)}")
    filled = with_candidates(truth, complete(projected, span.basis, args.steps, args.penalty))
    print(f"  the same, out-of-span part completed ({args.penalty}, {args.steps} steps): {score(filled, victim)}")
    if args.run:
        recon = pooled(restart_results(args.run), "kkt", {})
        print(f"  {args.run}: pooled candidates as they are: {score(recon, victim)}")
        done = with_candidates(recon, complete(recon.candidates, span.basis, args.steps, args.penalty))
        print(f"  the same, out-of-span part completed: {score(done, victim)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
