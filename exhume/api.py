"""The Python facade: the same verbs as the CLI (train, attack, evaluate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exhume.attacks import DEFAULT_METHOD, Reconstruction, check_uses_start, get_attack
from exhume.attacks.engine.memory import check_memory
from exhume.deadline import Deadline
from exhume.errors import ConfigError
from exhume.request import Output, Request, deadline_of, view_of
from exhume.victim import AttackerView, Victim


def attack(victim: Victim | AttackerView, method: str = DEFAULT_METHOD, seed: int = 0, *, request: Request | None = None,
           progress: bool = True, init: Any = None, init_name: str | None = None, mix: tuple[float, float] | None = None,
           init_seed: int = 0, storage: str | None = None, study_name: str | None = None,
           variants: list[dict[str, Any]] | None = None, deadline: Deadline | None = None, **settings: Any) -> Reconstruction:
    """Run the attack ``method`` (a registry name) on ``victim`` from ``seed``, as ``request`` asks.

    ``request`` (:class:`exhume.request.Request`): the threat model (weights only, the victim's loss and weight decay
    where its metadata lacks them, or a known start with its training settings), the budget (``max_seconds``,
    ``iterations``, ``restarts``, ``workers``, ``device``, ``dtype``, ``batch_restarts``) and the output (``out``,
    ``force``, ``resume``, ``checkpoint_every``, ``log_every``). The same settings may be given as flat keywords instead
    (the short form, ``attack(victim, method="kkt", max_seconds=60)``); the other keywords are the attack's own
    parameters (``exhume attack --list-params``). ``max_seconds`` counts from this call; a caller that made its own
    :class:`~exhume.deadline.Deadline` (the command line, from the process's start; the audit, its attack's share)
    gives ``deadline`` instead.

    For methods with a restart plan (``kkt``) the budget goes to a **portfolio** of restarts run
    in parallel and pooled (:func:`exhume.portfolio.run_portfolio`; ``max_seconds`` is then the
    whole portfolio's budget, ``iterations`` each restart's). ``restarts=1`` is exactly one run;
    ``storage``, ``study_name`` (a shared study) and ``variants`` are the portfolio's settings.
    Other methods run once unless ``restarts`` asks for more.

    Only the attacker's view of the victim (weights, task, loss, weight decay, input shape, data
    mean, and a known start) reaches the attack (:func:`exhume.request.view_of`). With ``out``,
    the attack checkpoints there and the result is saved there; ``resume`` continues from the last
    checkpoint (written for the same victim and start), ``force`` replaces a run already there. The
    folder is locked while the attack runs (:func:`exhume.files.runfolder.own_run_folder`).

    ``init``: the attack's own initialisation (``None``), display-space images (a tensor, named by
    ``init_name``), or one of ``"noise"`` (U(0,1)), ``"ground-truth"``, ``"partition"``, ``"mix"``
    (with ``mix=(λ₁, λ₂)``), built evaluator-side by :func:`exhume.evaluation.inits.build_init` from
    a :class:`Victim` (ground truth, partition and mix are oracle tools, labelled so in the result).
    """
    from exhume.portfolio import has_plan

    request, params = Request.of(request, settings)
    deadline = deadline_of(request, deadline)
    view = view_of(victim, request.threat)  # the attacker's view, with the start attached: once per run
    if view.start is not None:
        check_uses_start(method)  # given here, or carried by the view
    restarts = request.budget.restarts
    default_plan = restarts is None and has_plan(method) and init is None and mix is None
    if storage is not None or (restarts != 1 and (restarts is not None or default_plan)):
        if init is not None or mix is not None:
            raise ConfigError("init= and mix= set the start of one run: pass restarts=1 (--restarts 1)")
        return _portfolio(victim, view, method, params, request.on_view(), seed=seed, progress=progress, storage=storage,
                          study_name=study_name, variants=variants, deadline=deadline)
    atk = get_attack(method, **request.budget.attack_settings(method, params))
    atk.check(view)  # an unsupported victim fails here, before any initialisation is built
    device = request.budget.device
    check_memory(atk, view, device)  # so does a run the memory available cannot hold (one line, with settings that fit)
    init_kw = _init_kwargs(victim, atk, method, init, init_name, mix, init_seed)
    run = {"seed": seed, "device": device, "progress": progress, "deadline": deadline, **init_kw}
    return _run_once(atk, view, victim, run, request.output)


def _run_once(atk, view, victim, run: dict[str, Any], output: Output) -> Reconstruction:
    """One run of ``atk`` on ``view`` with the keywords ``run``: in ``output.folder`` (locked, owned by the victim's
    fingerprint, saved there) when given."""
    from exhume.attacks.engine.checkpoint import RunOwner
    from exhume.files.runfolder import fingerprint, own_run_folder

    fp = fingerprint(view.model)
    out, resume = output.folder, output.resume
    run = {**run, "resume": resume, "checkpoint_every": output.checkpoint_every, "log_every": output.log_every}
    if out is None:
        return _finish(atk.run(view, out=None, **run), victim, fp)
    owner = RunOwner(fp, atk.config.get("iterations", atk.config.get("steps")))
    with own_run_folder(out, resume=resume, force=output.force):
        result = _finish(atk.run(view, out=out, owner=owner, **run), victim, fp)
        result.save(out)
    return result


def _portfolio(source, view, method: str, params: dict[str, Any], request: Request, *, seed: int, progress: bool,
               storage, study_name, variants, deadline: Deadline) -> Reconstruction:
    """:func:`attack`'s portfolio branch: the restarts run and pooled by ``deadline``, in the output folder (locked) when
    given."""
    from dataclasses import replace

    from exhume.portfolio import run_portfolio

    out, resume = request.output.folder, request.output.resume
    request = replace(request, budget=replace(request.budget, max_seconds=None))  # it travels as the deadline

    def portfolio() -> Reconstruction:
        return run_portfolio(view, method, request=request, seed=seed, storage=storage, study_name=study_name,
                             variants=variants, progress=progress, deadline=deadline, **params)

    if out is None or storage is not None:  # a shared study keeps its restarts in the database
        return _finish(portfolio(), source, None)
    from exhume.files.runfolder import own_run_folder

    # a portfolio keeps its restarts (checkpoints included) in OUT/restarts/<k>/
    with own_run_folder(out, resume=resume, force=request.output.force, run_files=("reconstruction.json", "restarts"),
                        resume_from="restarts") as folder:
        check_owner(folder, view, resume)
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


def check_owner(folder: Path, view: AttackerView, resume: bool) -> None:
    """A portfolio folder records its victim's fingerprint (and its start's digest); a resume for other
    weights, or with another start, is refused."""
    from exhume.files.runfolder import RunFolderError, fingerprint
    from exhume.victim.start import start_digest

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
