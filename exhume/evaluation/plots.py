"""Figures for an evaluation (PNG files drawn with matplotlib's Agg canvas).

Figures are made with :class:`matplotlib.figure.Figure` and :class:`FigureCanvasAgg`, outside
pyplot: importing exhume never switches the global backend (a notebook keeps its own), and no
figure is left open in pyplot's registry.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..errors import ConfigError, DataError
from .metrics import EvalResult
from .ssim import as_images

__all__ = ["plot_sorted_ssim", "plot_ssim_vs_margin", "pairs_grid", "candidates_grid", "subplots", "save_figure"]


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None, squeeze: bool = True, **kwargs):
    """``(figure, axes)`` like ``pyplot.subplots``, on an Agg canvas of its own (no global state)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze, **kwargs)


def save_figure(fig, path) -> Path:
    """Save ``fig`` as a PNG (creating the folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _hwc(img: np.ndarray) -> tuple[np.ndarray, dict]:
    """``(C, H, W)`` -> an array and the imshow keywords: gray for C = 1, RGB for C = 3."""
    if img.shape[0] == 1:
        return img[0], {"cmap": "gray", "vmin": 0.0, "vmax": 1.0}
    if img.shape[0] == 3:
        return np.clip(np.transpose(img, (1, 2, 0)), 0, 1), {}
    raise DataError(f"can only draw 1- or 3-channel images, got {img.shape[0]} channels")


def _thresholds(metrics: dict) -> list[float]:
    return sorted(float(k[len("ssim>="):]) for k in metrics if k.startswith("ssim>="))


def plot_sorted_ssim(result: EvalResult, path: str | os.PathLike) -> Path:
    """Per-training-image SSIM of the best candidate, sorted (and the pool's, if computed)."""
    s = np.sort(np.asarray(result.arrays["ssim"], dtype=float))[::-1]
    fig, ax = subplots(figsize=(6, 4))
    x = np.arange(1, s.size + 1)
    ax.plot(x, s, lw=2, label=f"best reconstruction (rule: {result.metrics.get('match_rule')})")
    if result.arrays.get("pool_ssim") is not None:
        p = np.sort(np.asarray(result.arrays["pool_ssim"], dtype=float))[::-1]
        ax.plot(x, p, lw=1.5, ls="--", color="gray",
                label=f"best of {result.metrics.get('pool_size')} unseen images")
    if result.arrays.get("one_to_one_ssim") is not None:
        o = np.asarray(result.arrays["one_to_one_ssim"], dtype=float)
        o = np.sort(o[np.isfinite(o)])[::-1]
        ax.plot(np.arange(1, o.size + 1), o, lw=1, color="tab:green", label="one-to-one matching")
    for t, c in zip(_thresholds(result.metrics) or [0.4, 0.5], ["tab:orange", "tab:red", "k"]):
        ax.axhline(t, color=c, lw=0.8, ls=":", label=f"SSIM = {t:g}")
    ax.set_xlabel("training images, sorted by SSIM")
    ax.set_ylabel("SSIM")
    ax.set_ylim(min(0.0, float(np.nanmin(s)) - 0.05) if s.size else 0, 1.02)
    title = f"n = {result.metrics.get('n_train')}"
    if result.metrics.get("memorised") is not None:
        title += f", memorised: {result.metrics['memorised']}"
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower left")
    return save_figure(fig, path)


def plot_ssim_vs_margin(result: EvalResult, path: str | os.PathLike) -> Path:
    """Scatter of SSIM against each training image's margin (Haim et al., Fig. 4)."""
    if result.arrays.get("margin") is None:
        raise DataError("no margins in this result: pass margins= to evaluate_images")
    mar = np.asarray(result.arrays["margin"], dtype=float)
    s = np.asarray(result.arrays["ssim"], dtype=float)
    mem = result.arrays.get("memorised")
    fig, ax = subplots(figsize=(5.5, 4))
    if mem is None:
        ax.scatter(mar, s, s=12, alpha=0.8, label="training image")
    else:
        mem = np.asarray(mem, dtype=bool)
        ax.scatter(mar[~mem], s[~mem], s=12, alpha=0.6, color="tab:blue",
                   label="not memorised (pool as close or closer)")
        ax.scatter(mar[mem], s[mem], s=22, color="tab:red", edgecolor="k", lw=0.4,
                   label=f"memorised ({int(mem.sum())})")
    for t in _thresholds(result.metrics):
        ax.axhline(t, color="gray", lw=0.8, ls=":")
    ax.set_xlabel(r"margin $y_i\,\Phi(x_i)$")
    ax.set_ylabel("SSIM of best reconstruction")
    rho = result.metrics.get("margin_spearman_rho")
    if rho is not None:
        ax.set_title(f"Spearman rho = {rho:.3f}", fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _mosaic(fig, cells: dict[tuple[int, int], tuple[np.ndarray, str | None]], rows: int, cols: int, frames: bool) -> None:
    """Draw ``cells`` ({(row, col): (image (C, H, W), title or None)}) as ONE image on one axes, each title
    above its image: an axes per image cost ~0.03 s each to build and draw (a 100-image grid ~2 s)."""
    first = next(iter(cells.values()))[0]
    arr, kw = _hwc(first)
    h, w = arr.shape[:2]
    gap, band = max(1, w // 6), (max(2, h // 3) if any(t for _, t in cells.values()) else 0)
    cell_h, cell_w = band + h + gap, w + gap
    canvas = np.ones((rows * cell_h, cols * cell_w) + arr.shape[2:], dtype=float)
    ax = fig.add_axes((0, 0, 1, 1))
    for (r, c), (img, title) in cells.items():
        y0, x0 = r * cell_h + band, c * cell_w
        canvas[y0:y0 + h, x0:x0 + w] = _hwc(img)[0]
        if title:
            ax.text(x0 + w / 2, y0 - 0.5, title, fontsize=7, ha="center", va="bottom")
        if frames:
            ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), w, h, fill=False, lw=0.6, ec="black"))
    ax.imshow(canvas, interpolation="nearest", **kw)
    ax.axis("off")


def pairs_grid(candidates, train, pool, result: EvalResult, path: str | os.PathLike,
               which: str = "best", k: int = 24) -> Path:
    """Triples training image | best reconstruction | best pool image for the ``k`` best or worst.

    ``which``: ``"best"`` or ``"worst"`` training images by SSIM. ``pool`` may be None (the third
    column is then left out).
    """
    if which not in ("best", "worst"):
        raise ConfigError(f"which must be 'best' or 'worst', got {which!r}")
    train = as_images(train, "training images").numpy()
    candidates = as_images(candidates, "candidates").numpy()
    has_pool = pool is not None and result.arrays.get("best_pool") is not None
    pool = as_images(pool, "pool").numpy() if has_pool else None
    s = np.asarray(result.arrays["ssim"], dtype=float)
    order = np.argsort(-s, kind="stable") if which == "best" else np.argsort(s, kind="stable")
    order = order[:max(1, int(k))]
    per_row = 4                    # triples per row of the figure
    width = 3 if has_pool else 2
    rows = int(np.ceil(len(order) / per_row))
    cols = per_row * width
    fig = Figure(figsize=(cols * 1.0, rows * 1.15))
    FigureCanvasAgg(fig)
    mem = result.arrays.get("memorised")
    cells = {}
    for slot, i in enumerate(order):
        r, c0 = divmod(slot, per_row)
        c0 *= width
        cells[r, c0] = (train[i], f"train {i}" + (" *" if mem is not None and mem[i] else ""))
        cells[r, c0 + 1] = (candidates[int(result.arrays["best_candidate"][i])], f"rec {s[i]:.2f}")
        if has_pool:
            cells[r, c0 + 2] = (pool[int(result.arrays["best_pool"][i])], f"pool {float(result.arrays['pool_ssim'][i]):.2f}")
    _mosaic(fig, cells, rows, cols, frames=True)
    fig.suptitle(f"{which} {len(order)} training images by SSIM: training | reconstruction"
                 + (" | best unseen image  (* memorised)" if has_pool else ""), fontsize=8, y=1.02)
    return save_figure(fig, path)


def candidates_grid(candidates, path: str | os.PathLike, k: int = 100) -> Path:
    """A plain grid of the first ``k`` candidates."""
    cands = as_images(candidates, "candidates").numpy()[:max(1, int(k))]
    if cands.shape[0] == 0:
        raise DataError("no candidates to draw")
    cols = int(np.ceil(np.sqrt(cands.shape[0])))
    rows = int(np.ceil(cands.shape[0] / cols))
    fig = Figure(figsize=(cols * 0.8, rows * 0.8))
    FigureCanvasAgg(fig)
    _mosaic(fig, {divmod(j, cols): (img, None) for j, img in enumerate(cands)}, rows, cols, frames=False)
    return save_figure(fig, path)
