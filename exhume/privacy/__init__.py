"""Privacy accounting beside a measurement (docs/METHODS.md §7): DP-SGD's reconstruction bounds (:mod:`.bounds`),
a measured rate's exact interval and the prior's baseline from a control (:mod:`.rates`). A low floor: it imports
nothing of exhume but its errors.
"""

from exhume.privacy.bounds import Bound, dp_bound, rero_bound
from exhume.privacy.rates import clopper_pearson, kappa_from_control

__all__ = ["Bound", "clopper_pearson", "dp_bound", "kappa_from_control", "rero_bound"]
