"""The equations the attacks invert and the evaluation checks, from the weights alone (docs/METHODS.md): the equation
kinds, stationarity, the known start, the exact run, the span. A floor below both ``exhume/attacks/`` and
``exhume/evaluation/``: the attacks solve these equations for candidates, the evaluator measures them at the real training
data; nothing here imports the attacks or a room that holds the training set (docs/DESIGN.md)."""
