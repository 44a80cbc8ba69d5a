"""The Python facade: the same verbs as the CLI (train, attack, evaluate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exhume.attacks import Reconstruction, get_attack
from exhume.attacks.base import DEFAULT_METHOD, check_uses_start
from exhume.attacks.memory import check_memory
from exhume.device import check_device
from exhume.errors import ConfigError
from exhume.victim import AttackerView, Victim


def attack(victim: Victim | AttackerView, method: str = DEFAULT_METHOD, seed: int = 0, out: str | Path | None = None,
           resume: bool = False, device: str = "cpu", progress: bool = True, init: Any = None,
           init_name: str | None = None, mix: tuple[float, float] | None = None, init_seed: int = 0,
           force: bool = False, restarts: int | str | None = None, workers: int | None = None, storage: str | None = None,
           study_name: str | None = None, variants: list[dict[str, Any]] | None = None, start: Any = None, training: Any = None,
           start_partial: bool = False, batch_restarts: str = "auto", **kwargs: Any) -> Reconstruction:
    """Run the attack ``method`` (a registry name) with its keyword arguments on ``victim``.

    For methods with a restart plan (``kkt``) the budget goes to a **portfolio** of restarts run
    in parallel and pooled (:func:`exhume.portfolio.run_portfolio`; ``max_seconds`` is then the
    whole portfolio's budget, ``iterations`` each restart's). ``restarts=1`` is exactly one run,
    as before; ``restarts``, ``workers``, ``storage``, ``study_name``, ``variants`` and ``batch_restarts``
    ('auto': one batched process on a CUDA device, :mod:`exhume.portfolio.batched`) are the portfolio's settings.
    Other methods run once unless ``restarts`` asks for more.

    Only the attacker's view of the victim (weights, task, loss, weight decay, input shape, data
    mean) reaches the attack. With ``out``, the attack checkpoints there and the result is saved
    there; ``resume=True`` continues from the last checkpoint (written for the same victim, by
    its weights' fingerprint), ``force=True`` replaces a run already there. The folder is locked
    while the attack runs (:func:`exhume.files.runfolder.own_run_folder`).

    ``init``: the attack's own initialisation (``None``), display-space images (a tensor, named by
    ``init_name``), or one of ``"noise"`` (U(0,1)), ``"ground-truth"``, ``"partition"``, ``"mix"``
    (with ``mix=(λ₁, λ₂)``), built evaluator-side by :func:`exhume.evaluation.inits.build_init` from
    a :class:`Victim` (ground truth, partition and mix are oracle tools, labelled so in the result).

    ``start``: the weights training started from (tensors by name, or a safetensors / state-dict
    file; ``start_partial=True``: some parameters only) and ``training`` the settings the owner
    knows (:class:`exhume.victim.start.TrainingSettings`): ``kkt`` then solves the known-start
    equation (:mod:`exhume.attacks.trajectory`); a resume with another start is refused.
    """
    check_device(device)
    from exhume.portfolio import has_plan
    from exhume.victim.start import view_with_start

    victim_view = view_with_start(victim, start, training, start_partial)
    if getattr(victim_view, "start", None) is not None:
        check_uses_start(method)  # given here, or carried by the view
    default_plan = restarts is None and has_plan(method) and init is None and mix is None
    if storage is not None or (restarts != 1 and (restarts is not None or default_plan)):
        if init is not None or mix is not None:
            raise ConfigError("init= and mix= set the start of one run: pass restarts=1 (--restarts 1)")
        return _portfolio(victim, victim_view, method, kwargs, seed=seed, out=out, resume=resume, device=device, progress=progress,
                          force=force, restarts=restarts, workers=workers, storage=storage, study_name=study_name, variants=variants,
                          batch_restarts=batch_restarts)
    view = victim_view.attacker_view() if isinstance(victim_view, Victim) else victim_view
    if not isinstance(view, AttackerView):
        raise ConfigError(f"attack() needs a Victim or AttackerView, got {type(victim).__name__}")
    atk = get_attack(method, **kwargs)
    atk.check(view)  # an unsupported victim fails here, before any initialisation is built
    check_memory(atk, view, device)  # so does a run the memory available cannot hold (one line, with settings that fit)
    init_kw = _init_kwargs(victim, atk, method, init, init_name, mix, init_seed)
    return _run_once(atk, view, victim, init_kw, seed=seed, out=out, resume=resume, device=device, progress=progress, force=force)


def _run_once(atk, view, victim, init_kw: dict[str, Any], *, seed: int, out, resume: bool, device: str, progress: bool,
              force: bool) -> Reconstruction:
    """One run of ``atk`` on ``view``: in ``out`` (locked, owned by the victim's fingerprint, saved there) when given."""
    from exhume.attacks.checkpoint import run_owner
    from exhume.files.runfolder import fingerprint, own_run_folder

    fp = fingerprint(view.model)
    if out is None:
        return _finish(atk.run(view, out=None, seed=seed, device=device, resume=resume, progress=progress, **init_kw), victim, fp)
    budget = atk.config.get("iterations", atk.config.get("steps"))
    with own_run_folder(out, resume=resume, force=force), run_owner(fp, budget):
        result = _finish(atk.run(view, out=out, seed=seed, device=device, resume=resume, progress=progress, **init_kw), victim, fp)
        result.save(out)
    return result


def _portfolio(source, victim_view, method: str, kwargs: dict[str, Any], *, seed: int, out, resume: bool, device: str,
               progress: bool, force: bool, restarts, workers, storage, study_name, variants,
               batch_restarts: str = "auto") -> Reconstruction:
    """:func:`attack`'s portfolio branch: the restarts run and pooled, in ``out`` (locked) when given."""
    from exhume.portfolio import run_portfolio

    max_seconds = kwargs.pop("max_seconds", None)

    def portfolio() -> Reconstruction:
        return run_portfolio(victim_view, method, max_seconds=max_seconds, restarts=restarts, workers=workers, seed=seed, out=out,
                             resume=resume, storage=storage, study_name=study_name, variants=variants, device=device,
                             progress=progress, batch_restarts=batch_restarts, **kwargs)

    if out is None or storage is not None:  # a shared study keeps its restarts in the database
        return _finish(portfolio(), source, None)
    from exhume.files.runfolder import own_run_folder

    # a portfolio keeps its restarts (checkpoints included) in OUT/restarts/<k>/
    with own_run_folder(out, resume=resume, force=force, run_files=("reconstruction.json", "restarts"), resume_from="restarts") as folder:
        check_owner(folder, victim_view, resume)
        return _finish(portfolio(), source, None, out)


def _init_kwargs(victim, atk, method: str, init, init_name, mix, init_seed: int) -> dict[str, Any]:
    """The ``init``/``init_name`` of one run: given images, or ones built evaluator-side from a Victim's data."""
    if init is not None and not atk.takes_init:
        raise ConfigError(f"the {method!r} attack draws its candidates from a generator and takes no init; leave init unset")
    if isinstance(init, str):
        if not isinstance(victim, Victim):
            raise ConfigError(f"init {init!r} is built from the victim's data: pass the Victim, not its AttackerView")
        from exhume.evaluation.inits import build_init

        l1, l2 = mix if mix is not None else (None, None)
        built = build_init(victim, init, l1, l2, seed=init_seed)
        return {"init": built.images, "init_name": built.name}
    if init is not None:
        return {"init": init, "init_name": init_name or "given"}
    if mix is not None:
        raise ConfigError("mix=(l1, l2) needs init='mix'")
    return {}


def check_owner(folder: Path, victim, resume: bool) -> None:
    """A portfolio folder records its victim's fingerprint (and its start's digest); a resume for other
    weights, or with another start, is refused."""
    from exhume.files.runfolder import RunFolderError, fingerprint
    from exhume.portfolio.plan import as_view
    from exhume.victim.start import start_digest

    view = as_view(victim)
    digest = start_digest(view.start)
    mark, fp = Path(folder) / "victim.fingerprint", fingerprint(view.model)
    key = fp if digest is None else f"{fp} start {digest}"
    if resume and mark.is_file() and mark.read_text().strip() != key:
        saved = mark.read_text().strip()
        what = "another victim" if saved.split(" ")[0] != fp else "another starting point (start weights)"
        raise RunFolderError(f"cannot resume: the restarts in {folder} were computed for {what} "
                             f"(recorded {saved!r}, this run's {key!r}); choose another -o or pass --force")
    mark.write_text(key + "\n")


def _finish(result: Reconstruction, victim: Victim | AttackerView, fp: str | None, out=None) -> Reconstruction:
    if fp is not None:
        result.victim_fingerprint = fp  # what exhume.evaluate checks the victim against
    if isinstance(victim, Victim) and victim.path is not None and result.victim_path != str(victim.path):
        result.victim_path = str(victim.path)
        if out is not None:
            result.save(out)
    return result
