"""Screen: kkt restarts started from the victim's first-layer rows, against the default noise start.

    python research/first_layer_start.py --victim runs/zoo/victims/fashion-256-haim --out runs/start/fashion-256-haim \\
        --restarts 4 --iterations 2000

Why it might pay: gradient descent only ever adds combinations of the (centred) training inputs to
the rows of an MLP's first layer, and with a small initialisation those rows look like blends of
training images (Haim's regime). The stationarity attack follows its initialisation (Runkel et
al.), so starting candidates on the rows, instead of on noise of scale ``init_scale``, is an
attacker-side prior that uses the weights alone.

The rule measured ("rows"): each row ``w_k`` becomes the display-space image
``mean + 0.5 · w_k / max|w_k|`` (its largest pixel half the range away from the mean). The rows are
split by the sign of the victim's first output on those images; the first half of the candidates
(kkt's label +1 on a binary victim) draws rows at random from the positive part, the second half
from the rest (either part falls back to all rows when empty). On a 10-class victim kkt spreads
its labels evenly over the classes, so there the split does not follow the labels. kkt then
projects the starts onto the span as usual (``subspace="auto"``).

For each start, ``--restarts`` kkt runs of exactly ``--iterations`` iterations, restart ``k`` with
seed ``k`` and the portfolio's variant ``k % 2`` (``lr_lambda`` 1e-4 / 1e-2), two at a time on
one core each; saved under ``OUT/<start>/<k>/`` (a rerun reuses them). Then the first two restarts'
candidates concatenated (the zoo's 90-second portfolio), all of them, and the mixed pair noise 0 +
rows 1, judged by ``exhume.evaluate`` (1000 unseen pool images; control on held-out non-members).
Evaluator-side: reads the training set to judge.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

import exhume
from exhume.attacks import get_attack, load_reconstruction
from exhume.attacks.subspace import input_layer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: exhume and benchmarks.zoo
from benchmarks.zoo.run import pooled  # noqa: E402  (the zoo's concatenation of restarts' candidates)

VARIANTS = [{}, {"lr_lambda": 1e-2}]
CONTRAST = 0.5


def row_starts(view, m: int, seed: int) -> torch.Tensor:
    """``m`` display-space starting images built from the first layer's rows (the rule above)."""
    params = dict(view.model.named_parameters())
    name = input_layer(view.model, params, tuple(view.input_shape))
    if name is None:
        raise SystemExit("this victim's input does not enter through one linear map: no rows to start from")
    w = params[name].detach().double()
    d = w / w.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    x = view.mean.double().reshape(1, -1) + CONTRAST * d
    with torch.no_grad():
        first = view.model(x.float().reshape(-1, *view.input_shape)).reshape(x.shape[0], -1)[:, 0]
    everyone = torch.argsort(w.norm(dim=1), descending=True).tolist()  # largest rows first (the draw below is random)
    pos = [k for k in everyone if first[k] > 0] or everyone
    neg = [k for k in everyone if first[k] <= 0] or everyone
    gen = torch.Generator().manual_seed(seed)
    pick = []
    for rows, count in ((pos, m // 2), (neg, m - m // 2)):
        perm = torch.randperm(len(rows), generator=gen).tolist()
        pick += [rows[perm[i % len(rows)]] for i in range(count)]
    return x[pick].reshape(m, *view.input_shape).float()


def one_restart(job: tuple[str, str, int, str, int]) -> None:
    victim_dir, out, k, start, iterations = job
    torch.set_num_threads(1)
    folder = Path(out) / start / str(k)
    if (folder / "reconstruction.json").exists():
        return
    view = exhume.load_victim(victim_dir).attacker_view()
    attack = get_attack("kkt", iterations=iterations, **VARIANTS[k % 2])
    m = attack.config["m"] or round(attack.config["candidates_per_point"] * (attack.config["n_guess"] or view.n_train_hint or 100))
    init = row_starts(view, m, k) if start == "rows" else None
    attack.run(view, seed=k, progress=False, init=init, init_name=start).save(folder)


def judged(victim, recs: list) -> str:
    m = exhume.evaluate(pooled(recs, "kkt", {}), victim, pool_size=1000, figures=False).metrics
    return f"{m['memorised']} / {m['memorised_control']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", required=True, help="a victim folder (with its training set's data spec)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the evaluation")
    args = ap.parse_args(argv)
    if args.restarts < 2:
        raise SystemExit(f"--restarts: expected 2 or more, got {args.restarts}")
    starts = ("noise", "rows")
    with ProcessPoolExecutor(2) as ex:
        list(ex.map(one_restart, [(args.victim, args.out, k, s, args.iterations) for s in starts for k in range(args.restarts)]))
    torch.set_num_threads(args.threads)
    victim = exhume.load_victim(args.victim)
    recs = {s: [load_reconstruction(Path(args.out) / s / str(k)) for k in range(args.restarts)] for s in starts}
    print(f"| {Path(args.victim).name} | " + " | ".join(f"{judged(victim, recs[s][:2])} ({judged(victim, recs[s])})" for s in starts)
          + f" | {judged(victim, [recs['noise'][0], recs['rows'][1]])} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
