"""The names a setting may take where several rooms offer it, each list declared once.

The victim's training, the known start, the attacks and the command line import these rather
than spell the names again (``tests/test_settings_once.py`` checks that no such list appears twice
in ``exhume/``). Lists that belong to one room stay there: the losses in :mod:`exhume.losses`, the
match rules in :mod:`exhume.evaluation.matching`, the default attack in :mod:`exhume.attacks.engine.base`.
"""

from __future__ import annotations

#: the precisions a victim is trained in and an attack computes in (torch dtypes of these names)
DTYPE_NAMES = ("float32", "float64")

#: exhume's full-batch victim training (``exhume train``): gradient descent on the whole set, or Adam
FULL_BATCH_OPTIMIZERS = ("gd", "adam")

#: exhume's own mini-batch steps: an attack's candidates (and kkt's multipliers), mini-batch victim training
STEP_OPTIMIZERS = ("adam", "sgd")

#: the optimisers a known start's training may have used (``torch.optim``'s SGD, Adam, AdamW)
TRAINING_OPTIMIZERS = ("sgd", "adam", "adamw")

#: how a portfolio's restarts run: 'auto' (as one batched problem on a CUDA device), 'on', 'off' (one worker process each)
BATCH_CHOICES = ("auto", "on", "off")
