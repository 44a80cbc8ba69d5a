"""The attacker-side score, kept beside the attacks (:mod:`exhume.attacks.score`); named here for older imports."""

from exhume.attacks.score import (  # noqa: F401
    DUPLICATE_COSINE,
    MIN_DEVIATION,
    PIXEL_SLACK,
    attacker_score,
    candidate_terms,
    check_scorable,
    earlier_duplicates,
    score_reconstruction,
)
