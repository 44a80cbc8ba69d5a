"""Reading a file of named tensors (a state dict) safely: safetensors, or ``torch.load(weights_only=True)``.

A whole pickled module is refused, never unpickled. Every failure is one
:class:`~exhume.errors.VictimError` naming the file and what was expected.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path

import torch

from exhume.errors import VictimError

TENSOR_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
_NESTED_KEYS = ("state_dict", "model_state_dict", "model")


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


def _sniff(path: Path) -> str:
    """What a file that is not safetensors looks like, from its first bytes."""
    head = path.read_bytes()[:8] if path.stat().st_size >= 8 else path.read_bytes()
    if head[:2] == b"PK":
        return "a torch.save file (zip)"
    if head[:1] == b"\x80":
        return "a Python pickle"
    return "not a safetensors file"


def read_tensors(path: str | Path, what: str = "weights file") -> dict[str, torch.Tensor]:
    """The named tensors in ``path`` (a ``.safetensors`` file or a ``.pt``/``.pth``/``.bin`` state dict); ``what``
    names the file in an error."""
    path = Path(path)
    if not path.is_file():
        raise VictimError(f"{what} {path} does not exist; expected {', '.join(TENSOR_SUFFIXES)}")
    if path.suffix not in TENSOR_SUFFIXES:
        raise VictimError(f"{what} {path}: unknown suffix {path.suffix!r}; expected .safetensors, or a .pt/.pth state dict")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as e:
            raise VictimError(f"{what} {path} is not a readable safetensors file ({_sniff(path)}: {_one_line(e)}); is it "
                              "truncated? Save it with safetensors.torch.save_file(model.state_dict(), PATH), or name a "
                              "torch.save(model.state_dict()) file .pt") from None
    try:
        with warnings.catch_warnings():  # the one line below says what torch would warn about
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise VictimError(f"{what} {path} holds pickled Python objects (e.g. a whole model saved with torch.save(model)), "
                          "which exhume never unpickles; save the weights only: torch.save(model.state_dict(), PATH) "
                          "or safetensors.torch.save_file(model.state_dict(), PATH)") from None
    except (RuntimeError, OSError, EOFError, zipfile.BadZipFile, ValueError) as e:
        raise VictimError(f"{what} {path} is not a readable torch.save state dict ({_one_line(e)}); is it truncated?") from None
    if isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        nested = [k for k in _NESTED_KEYS if isinstance(obj.get(k), dict)]
        obj = obj[nested[0]] if nested else obj
    if not isinstance(obj, dict) or not obj or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise VictimError(f"{what} {path} is not a state dict of tensors; save model.state_dict(), not {type(obj).__name__}")
    return obj
