"""research/memorised_sets.py: each reconstruction's memorised training images, their differences and union.

Not part of the suite (research/ is not maintained): ``python -m pytest research/test_memorised_sets.py`` from the
repository root.
"""

from __future__ import annotations

import memorised_sets
import torch

from exhume.attacks.base import Reconstruction
from exhume.victim import TrainConfig, make_victim


def _sets(out: str) -> dict[str, set[int]]:
    """``{line head: the set of indices}`` of the script's set lines (those ending in a bracketed list)."""
    sets = {}
    for line in out.splitlines():
        if line.endswith("]") and "[" in line and not line.startswith("training image"):
            head, _, rest = line.partition(": ")
            inside = rest[rest.index("[") + 1:-1]
            sets[head] = {int(t) for t in inside.split(",") if t.strip()}
    return sets


def test_copies_of_training_images_are_memorised_and_the_sets_compared(tmp_path, capsys):
    torch.manual_seed(0)
    victim = make_victim("mnist", "odd-even", 10, "affine", TrainConfig(lr=0.5, weight_decay=5e-3, max_epochs=20),
                         seed=0, progress=False, test_size=0)
    victim.save(tmp_path / "victim")
    x, y = victim.train_set.x, victim.train_set.y
    gen = torch.Generator().manual_seed(1)
    noise = torch.rand(4, *x.shape[1:], generator=gen)  # candidates that resemble no digit
    for name, rows in {"first": [0, 1, 2, 3, 4], "second": [3, 4, 5, 6, 7, 8]}.items():
        idx = torch.tensor(rows)
        Reconstruction(method="hand", candidates=torch.cat([x[idx], noise]),
                       labels=torch.cat([y[idx], torch.ones(4, dtype=y.dtype)]), scores=None, config={},
                       seed=0).save(tmp_path / name)

    assert memorised_sets.main(["--victim", str(tmp_path / "victim"), str(tmp_path / "first"),
                                str(tmp_path / "second"), "--images", "0,9"]) == 0
    out = capsys.readouterr().out
    sets = _sets(out)
    # an exact copy scores SSIM 1, above any of the 1000 unseen pool digits; noise beats none
    assert sets["first"] == {0, 1, 2, 3, 4}
    assert sets["second"] == {3, 4, 5, 6, 7, 8}
    assert sets["in first, not in second"] == {0, 1, 2}
    assert sets["in second, not in first"] == {5, 6, 7, 8}
    assert sets["union"] == set(range(9))
    lines = {line.split(":")[0]: line for line in out.splitlines() if line.startswith("training image")}
    assert "first 1.000" in lines["training image 0"] and "second 1.000" not in lines["training image 0"]
    assert "first 1.000" not in lines["training image 9"] and "second 1.000" not in lines["training image 9"]
