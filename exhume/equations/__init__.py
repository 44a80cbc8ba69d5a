"""The equations the attacks invert and the evaluation checks, from the weights alone (docs/METHODS.md).

A floor below both ``exhume/attacks/`` and ``exhume/evaluation/``: the attacks solve these equations for candidates,
the evaluator measures them at the real training data. Nothing here imports the training set's rooms (``data``,
``victim``, ``evaluation``) or the attacks (``tests/test_protocol.py`` checks it).

- :mod:`~exhume.equations.kinds`: the equation an attack declares, as a description, and the one a run solved;
- :mod:`~exhume.equations.stationarity`: ``θ = Σ_i λ_i ∇_θ h(Φ(θ; x_i), y_i)``, its residual and least squares, with the
  surrogate ReLU's derivative (:mod:`~exhume.equations.surrogate`) and the choice of ``h`` and the multipliers' scale
  (:mod:`~exhume.equations.formulation`);
- :mod:`~exhume.equations.trajectory`: the equation of what training added to a known start;
- :mod:`~exhume.equations.exact`: the owner's whole run replayed on candidates, by the recipe's update rules and batch
  order (:mod:`~exhume.equations.recipe`);
- :mod:`~exhume.equations.span`: where the training inputs' span shows in the weights, and the initialisation's noise;
- :mod:`~exhume.equations.workcopy`: the working copy of the model every equation is evaluated on.
"""
