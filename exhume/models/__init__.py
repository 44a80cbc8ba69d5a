"""Model builders: a victim's architecture is a small JSON-able spec turned into an nn.Module."""

from exhume.models.affine import Affine
from exhume.models.builders import ARCHITECTURES, build_model, parse_arch
from exhume.models.cnn import CNN
from exhume.models.mlp import MLP

__all__ = ["ARCHITECTURES", "CNN", "MLP", "Affine", "build_model", "parse_arch"]
