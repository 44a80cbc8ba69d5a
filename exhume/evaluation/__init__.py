"""Judging reconstructions: SSIM, matching, the memorisation count, and figures (docs/METHODS.md §4)."""

from .matching import MATCH_RULES, best_match, l2_matrix, match, match_downsample, ncc_matrix, one_to_one, rule_similarity
from .membership import membership_uncertainty
from .metrics import EvalResult, Metrics, evaluate_images, support_estimate
from .plots import candidates_grid, pairs_grid, plot_sorted_ssim, plot_ssim_vs_margin
from .ssim import as_images, ssim_matrix, ssim_pairs, window_description, window_for

__all__ = [
    "MATCH_RULES", "best_match", "one_to_one", "l2_matrix", "ncc_matrix", "match",
    "match_downsample", "rule_similarity",
    "EvalResult", "Metrics", "evaluate_images", "support_estimate", "membership_uncertainty",
    "plot_sorted_ssim", "plot_ssim_vs_margin", "pairs_grid", "candidates_grid",
    "as_images", "ssim_matrix", "ssim_pairs", "window_for", "window_description",
]
