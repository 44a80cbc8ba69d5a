"""Privacy accounting beside a measurement: reconstruction bounds of a DP-SGD mechanism and intervals of measured rates.

- :mod:`exhume.privacy.bounds`: the most any informed adversary reconstructs of a record from a model trained
  with DP-SGD (Hayes, Mahloujifar and Balle 2023), computed from the mechanism's own noise multiplier, sampling
  rate and steps: in closed form at rate 1, from Google's ``dp_accounting`` privacy loss distribution below it
  (the optional extra ``exhume[dp]``), each with its numerical error; and from (ε, δ) alone (Balle, Cherubin and
  Hayes 2022).
- :mod:`exhume.privacy.rates`: a measured success rate's exact (Clopper–Pearson) interval, and the prior's
  baseline κ from a control.

A floor below the victim, the evaluation and the audit: it imports nothing of exhume but its errors
(docs/METHODS.md §7).
"""

from exhume.privacy.bounds import Bound, dp_bound, rero_bound
from exhume.privacy.rates import clopper_pearson, kappa_from_control

__all__ = ["Bound", "clopper_pearson", "dp_bound", "kappa_from_control", "rero_bound"]
