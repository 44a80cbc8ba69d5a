"""The ``exhume`` command: a thin layer over the Python API (no logic lives here)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exhume.attacks import DEFAULT_METHOD
from exhume.choices import BATCH_CHOICES, DTYPE_NAMES, TRAINING_OPTIMIZERS
from exhume.errors import ConfigError, DivergenceError, ExhumeError, VictimError
from exhume.params import parse_params, parse_restarts


def _common(p: argparse.ArgumentParser, out_default: str | None = None) -> None:
    p.add_argument("-o", "--out", default=out_default, required=out_default is None, help="run folder to write")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exhume", description="Reconstruct training data from a network's weights and measure the leak.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    from exhume.commands.train import add_parser as add_train_parser

    add_train_parser(sub, _common)  # exhume train: flags and training configs in exhume/commands/train.py
    for add in (_add_attack, _add_evaluate, _add_tune, _add_report):
        add(sub)
    from exhume.audit.command import add_parser as add_audit_parser

    add_audit_parser(sub)  # exhume audit: flags and config in exhume/audit/command.py
    _add_experiment(sub)
    return parser


def _add_demo(sub) -> None:
    """``exhume demo``."""
    from exhume.demo import DEMO_ATTACK_SECONDS, DEMO_TRAIN, demo_seconds

    p = sub.add_parser("demo", help=f"train a small victim on bundled MNIST ({DEMO_TRAIN['max_epochs']} epochs), attack it with kkt "
                       f"({DEMO_ATTACK_SECONDS:g} s of wall time), evaluate and report, all within the two budgets' sum "
                       f"({demo_seconds():g} s from the start)")
    _common(p, "runs/demo")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="float32", help="precision of training and attack (default float32)")
    p.add_argument("--train-seconds", type=float, default=None,
                   help=f"cap on the victim's training time (default {DEMO_TRAIN['max_seconds']:g} s)")
    p.add_argument("--attack-seconds", type=float, default=None,
                   help=f"attack budget (default {DEMO_ATTACK_SECONDS:g} s); the whole demo keeps --train-seconds + "
                        "--attack-seconds from its start: the attack gets less (at least half) if training, set-up and "
                        "the evaluation's estimate need it")
    p.add_argument("--resume", action="store_true", help="reuse the victim and continue the attack from its checkpoint")
    p.add_argument("--force", action="store_true", help="replace a demo already in --out")


def _add_attack(sub) -> None:
    """``exhume attack``."""
    from exhume.attacks import ATTACKS

    p = sub.add_parser("attack", help="reconstruct training data from a victim's weights")
    p.add_argument("victim", help="victim folder written by 'exhume train'")
    _common(p)
    p.add_argument("--method", default=DEFAULT_METHOD, help=f"attack name: {', '.join(sorted(ATTACKS))} (default {DEFAULT_METHOD})")
    p.add_argument("--list-params", action="store_true", help="print the attack's parameters (name, default, range, meaning) and exit")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="computation precision (default: the attack's, float32)")
    p.add_argument("--iterations", type=int, default=None, help="maximum optimisation steps (default: the attack's)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="wall-clock budget of this command in seconds, from its start; --resume continues with a new one (default: none)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="steps between checkpoints (default: the attack's)")
    p.add_argument("--log-every", type=int, default=None, help="steps between loss-history entries (default: the attack's)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="any attack parameter, e.g. -p lr=0.5 -p alpha=19")
    p.add_argument("--preset", default=None, metavar="NAME", help="the attack's named settings (--list-params lists them); -p wins")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out (written for this victim)")
    p.add_argument("--force", action="store_true", help="replace a run already in --out")
    from exhume.evaluation.inits import INIT_KINDS

    p.add_argument("--init", default="default", choices=("default", *INIT_KINDS),
                   help="starting candidates: the attack's own (default), U(0,1) noise, or evaluator-built images from "
                        "the victim's data (ground-truth, partition, mix; labelled oracle in every output)")
    p.add_argument("--mix-l1", type=float, default=None, help="mix: weight of ground truth vs partition (λ₁ in [0, 1])")
    p.add_argument("--mix-l2", type=float, default=None, help="mix: weight of images vs U(0,1) noise (λ₂ in [0, 1])")
    p.add_argument("--init-seed", type=int, default=0, help="seed of the noise images of --init noise/mix (default 0)")
    p.add_argument("--restarts", default=None, metavar="N|auto",
                   help="restarts pooled into one result (default: auto for kkt, 1 for other methods); 1 = one run, as before")
    p.add_argument("--workers", type=int, default=None, help="parallel restarts on this machine (default: the cores, at most 8)")
    p.add_argument("--storage", default=None,
                   help="share the restarts with other machines through a study, e.g. postgresql://user:pass@host/db or sqlite:///p.db")
    p.add_argument("--study-name", default=None, help="study name in --storage (default exhume-portfolio)")
    p.add_argument("--batch-restarts", default="auto", choices=BATCH_CHOICES,
                   help="run the restarts as one batched problem in this process (auto: on a CUDA device; "
                        "exhume/portfolio/batched.py) or one per worker process (off)")
    p.add_argument("--worker", action="store_true", help="with --storage: only run restarts of the study (no pooling); "
                   "start the pooling 'exhume attack' without --worker on one machine")

    add_start_arguments(p)


def _add_evaluate(sub) -> None:
    """``exhume evaluate``."""
    p = sub.add_parser("evaluate", help="judge a reconstruction against the victim's training set")
    p.add_argument("run", help="attack run folder")
    p.add_argument("--against", required=True, help="victim folder (its training set is rebuilt from the saved spec)")
    p.add_argument("-o", "--out", default=None, help="where to write metrics and figures (default: RUN/evaluation)")
    p.add_argument("--pool-size", type=int, default=1000, help="unseen images for the memorisation count (default 1000)")
    from exhume.evaluation.matching import MATCH_RULES

    p.add_argument("--match", default="ssim", choices=MATCH_RULES,
                   help="rule that picks each image's best candidate: ssim (default), l2 or ncc (see exhume/evaluation/matching.py)")
    p.add_argument("--force", action="store_true", help="replace an evaluation already in --out")
    from exhume.evaluation.run import CANDIDATE_SCALES

    p.add_argument("--candidate-scale", default="clip", choices=tuple(CANDIDATE_SCALES),
                   help="candidates to display space: clip to [0, 1] (default) or rescale each by its own min and max (for "
                        "attacks that fix an image only up to a positive scale; applied alike against training, pool and control)")


def _add_tune(sub) -> None:
    """``exhume tune``."""
    p = sub.add_parser("tune", help="search an attack's hyperparameters (those that declare a search range) with Optuna, "
                                    "scored without the training set")
    p.add_argument("victim", help="victim folder written by 'exhume train' (only its attacker's view is used)")
    _common(p)
    p.add_argument("--trials", type=int, required=True, help="number of finished trials the study should reach")
    p.add_argument("--trial-seconds", type=float, default=60.0, help="attack budget per trial (default 60 s)")
    p.add_argument("--storage", default=None, help="Optuna storage URL shared by workers, e.g. postgresql://user:pass@host/db (default: OUT/tune.db)")
    p.add_argument("--method", default=DEFAULT_METHOD, help=f"the attack whose hyperparameters are searched (default {DEFAULT_METHOD})")
    p.add_argument("--study-name", default=None, help="study name in the storage (default exhume-METHOD)")
    p.add_argument("--no-prune", action="store_true", help="run every trial to its budget (no median pruning)")
    p.add_argument("--heartbeat", type=int, default=5, help="seconds between a worker's heartbeats; a trial silent for 4x this is failed and retried "
                   "(default 5)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="an attack parameter fixed for all trials, e.g. -p m=200")


def _add_report(sub) -> None:
    """``exhume report``."""
    p = sub.add_parser("report", help="write a self-contained HTML audit report for an evaluated attack run")
    p.add_argument("run", help="attack run folder (with an evaluation/ subfolder from 'exhume evaluate')")
    p.add_argument("-o", "--out", default=None, help="HTML file to write (default: RUN/report.html)")
    p.add_argument("--against", default=None, help="victim folder: evaluate the run first if RUN/evaluation is missing")
    p.add_argument("--force", action="store_true", help="replace a report already at --out")


def _add_experiment(sub) -> None:
    """``exhume experiment NAME``: one subcommand per registered experiment."""
    from exhume.experiments import EXPERIMENTS

    p = sub.add_parser("experiment", help="run a named experiment that reproduces a paper's finding (each states its CPU default; "
                       "times measured: docs/defaults.md#experiments-cpu-defaults)")
    exp_sub = p.add_subparsers(dest="experiment", required=True, help="the experiment to run")
    for name, exp in sorted(EXPERIMENTS.items()):
        text = exp.help.replace("%", "%%")  # argparse formats help strings with %
        q = exp_sub.add_parser(name, help=text, description=text)
        _common(q, f"runs/experiment-{name}")
        q.add_argument("--full", action="store_true", help="the paper's scale instead of the CPU budget (expected wall "
                       "times on a GPU and on 2 CPU cores: docs/defaults.md#experiments-full-scale); "
                       "run it in checkpointed chunks with --chunk-seconds and --resume")
        q.add_argument("--force", action="store_true", help="run again in an --out that holds an earlier run of it, replacing its results")
        q.add_argument("--chunk-seconds", type=float, default=None, help=f"stop after this much wall time, checkpointed as on "
                       f"Ctrl-C (exit code {CHUNK_ENDED}); run the same command with --resume to go on: --full on a CPU, "
                       "chunk by chunk")
        if exp.add_arguments is not None:
            exp.add_arguments(q)


def _cmd_demo(args: argparse.Namespace) -> int:
    from exhume.demo import demo_seconds, run_demo

    run_demo(out=args.out, seed=args.seed, device=args.device, dtype=args.dtype, train_seconds=args.train_seconds,
             attack_seconds=args.attack_seconds, resume=args.resume, progress=not args.no_progress, force=args.force,
             deadline=command_deadline(demo_seconds(args.train_seconds, args.attack_seconds)))
    return 0


def add_start_arguments(p: argparse.ArgumentParser) -> None:
    """The threat model's flags: the victim's loss and weight decay where its metadata lacks them, the weights training
    started from and the training settings the owner knows."""
    f = p.add_argument_group("the victim's training", "facts the attacker knows that the victim's metadata lacks "
                             "(a statement that contradicts the metadata is refused)")
    f.add_argument("--loss", default=None, help="its training loss: logistic, cross-entropy, squared, ...")
    f.add_argument("--weight-decay", type=float, default=None, help="its weight decay w in mean loss + w/2 |theta|^2")
    g = p.add_argument_group("known start", "the weights training started from (a public checkpoint a model was fine-tuned "
                             "from, or the owner's initial weights) and, optionally, how training ran from there")
    g.add_argument("--start-weights", default=None, metavar="FILE",
                   help="the starting weights: .safetensors, or a .pt/.pth state dict (never a pickled model)")
    g.add_argument("--start-partial", action="store_true",
                   help="the start file covers only some parameters (e.g. a public backbone without the new head)")
    g.add_argument("--train-optimizer", default=None, choices=TRAINING_OPTIMIZERS, help="the optimiser training used")
    g.add_argument("--train-lr", type=float, default=None, help="its learning rate")
    g.add_argument("--train-momentum", type=float, default=None, help="SGD's momentum (default 0)")
    g.add_argument("--train-betas", default=None, metavar="B1,B2", help="Adam's betas (default 0.9,0.999)")
    g.add_argument("--train-weight-decay", type=float, default=None, help="its weight_decay (default: the victim's)")
    g.add_argument("--train-steps", type=int, default=None, help="optimiser steps taken (or --train-epochs and --train-batch-size)")
    g.add_argument("--train-epochs", type=int, default=None, help="epochs trained")
    g.add_argument("--train-batch-size", type=int, default=None, help="mini-batch size")
    g.add_argument("--optimizer-state", default=None, metavar="FILE",
                   help="Adam's final state: tensors exp_avg_sq.<parameter> (+ step), or torch.save(optimizer.state_dict())")


def start_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The threat model's fields (:class:`exhume.request.ThreatModel`) from its flags (empty without them)."""
    facts = {k: getattr(args, k) for k in ("loss", "weight_decay") if getattr(args, k) is not None}
    return {**facts, **_start_fields(args)}


def _start_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The known start's fields of the threat model (empty without --start-weights)."""
    training: dict[str, Any] = {}
    for key in ("optimizer", "lr", "momentum", "weight_decay", "steps", "epochs", "batch_size"):
        value = getattr(args, f"train_{key}")
        if value is not None:
            training[key] = value
    if args.train_betas is not None:
        try:
            training["betas"] = tuple(float(b) for b in args.train_betas.split(","))
        except ValueError:
            raise ConfigError(f"--train-betas expects two numbers B1,B2, got {args.train_betas!r}") from None
    if args.start_weights is None:
        if training or args.start_partial or args.optimizer_state is not None:
            raise ConfigError("the training settings (--train-*, --optimizer-state, --start-partial) describe training from a "
                              "start: pass --start-weights FILE too")
        return {}
    return {"start": args.start_weights, "training": training or None, "start_partial": args.start_partial,
            "optimizer_state": args.optimizer_state}


def command_deadline(seconds: float | None):
    """A command's :class:`~exhume.deadline.Deadline`: ``seconds`` (checked as a budget's) from the process's start, so
    that the interpreter's start-up and the loading count too."""
    import time

    from exhume.deadline import Deadline
    from exhume.evaluation.cost import since_process_start
    from exhume.request import Budget

    Budget(max_seconds=seconds)
    return Deadline.after(seconds, since=time.time() - since_process_start())


def _cmd_attack(args: argparse.Namespace) -> int:
    import exhume

    kwargs = parse_params(args.param)
    for key in ("dtype", "iterations", "preset", "checkpoint_every", "log_every"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    deadline = None if args.max_seconds is None else command_deadline(args.max_seconds)  # else -p max_seconds=, if given
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    restarts = parse_restarts(args.restarts, "--restarts")
    victim = exhume.load_victim(args.victim)
    if args.worker:
        from exhume.portfolio import portfolio_worker

        if args.storage is None:
            raise ConfigError("--worker needs --storage (the study to take restarts from)")
        from exhume.request import ThreatModel, view_of

        worker_view = view_of(victim, ThreatModel(**start_arguments(args)))
        ran = portfolio_worker(worker_view, storage=args.storage, study_name=args.study_name, workers=args.workers, out=args.out,
                               device=args.device, progress=not args.no_progress)
        print(f"worker finished: ran {ran} restart(s) of the study; the pooling 'exhume attack' writes the result")
        return 0
    init = None if args.init == "default" else args.init
    if init != "mix" and (args.mix_l1 is not None or args.mix_l2 is not None):
        raise ConfigError("--mix-l1/--mix-l2 apply only with --init mix")
    mix = (args.mix_l1, args.mix_l2) if init == "mix" else None
    result = exhume.attack(victim, method=args.method, seed=args.seed, out=args.out, resume=args.resume,
                           device=args.device, progress=not args.no_progress, init=init, mix=mix,
                           init_seed=args.init_seed, force=args.force, restarts=restarts, workers=args.workers,
                           storage=args.storage, study_name=args.study_name, batch_restarts=args.batch_restarts,
                           deadline=deadline, **start_arguments(args), **kwargs)
    record = result.record
    oracle = " (ORACLE initialisation: built from the victim's data)" if record.oracle_init else ""
    if record.portfolio is None:
        print(f"reconstruction saved to {args.out}: {result.candidates.shape[0]} candidates, init {record.init}{oracle}, "
              f"{json.dumps(record.summary_json())}")
        return 0
    from exhume.portfolio.report import summary_lines

    print(f"reconstruction saved to {args.out}: {result.candidates.shape[0]} candidates{oracle}")
    for line in summary_lines(record.summary_json(), record.portfolio.config_json()):
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    return 0


#: the files that mean an evaluation is already in a folder (``exhume evaluate`` replaces them only with --force)
EVALUATION_FILES = ("metrics.json", "arrays.npz")


def _cmd_evaluate(args: argparse.Namespace) -> int:
    import exhume
    from exhume.evaluation.run import format_table, summary_rows

    if args.pool_size < 1:
        raise ConfigError(f"--pool-size must be at least 1 (the memorisation count compares with unseen images), got {args.pool_size}")
    from exhume.files.runfolder import refuse_existing

    out = Path(args.out) if args.out else Path(args.run) / "evaluation"
    refuse_existing(out, EVALUATION_FILES, args.force, "an evaluation")
    recon = exhume.load_reconstruction(args.run)
    victim = exhume.load_victim(args.against)
    try:
        result = exhume.evaluate(recon, victim, pool_size=args.pool_size, match=args.match, out=out,
                                 candidate_scale=args.candidate_scale)
    except VictimError as e:  # e.g. the run was attacked from another victim: name the run folder too
        raise VictimError(f"{args.run}: {e}") from None
    print(format_table(summary_rows(result.metrics)))
    print(f"metrics and figures written to {out}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    import exhume
    from exhume.request import view_of
    from exhume.tune import tune

    if args.trials < 1:
        raise ConfigError(f"--trials must be at least 1, got {args.trials}")
    if not args.trial_seconds > 0:
        raise ConfigError(f"--trial-seconds must be positive, got {args.trial_seconds}")
    if args.heartbeat < 1:
        raise ConfigError(f"--heartbeat must be at least 1 second, got {args.heartbeat}")
    victim = exhume.load_victim(args.victim)
    summary = tune(view_of(victim), args.trials, args.out, trial_seconds=args.trial_seconds, storage=args.storage,
                   study_name=args.study_name, seed=args.seed, device=args.device, prune=not args.no_prune,
                   progress=not args.no_progress, victim_path=str(Path(args.victim).resolve()), fixed=parse_params(args.param),
                   heartbeat_interval=args.heartbeat, grace_period=4 * args.heartbeat, method=args.method)
    print(json.dumps(summary, indent=2, default=str))
    if summary.get("best_trial") is None:
        raise DivergenceError(f"no trial of study {summary['study']!r} finished without diverging: no best setting (trials in {args.out})")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from exhume.files.runfolder import RunFolderError
    from exhume.report import write_report

    target = Path(args.out) if args.out else Path(args.run) / "report.html"
    if target.exists() and not args.force:
        raise RunFolderError(f"{target} already exists (a report); pass --force to replace it, or choose another -o")
    path = write_report(args.run, out=args.out, against=args.against)
    print(f"report written to {path}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from exhume.commands.train import run

    return run(args)


def _cmd_audit(args: argparse.Namespace) -> int:
    from exhume.audit.command import run

    return run(args)


CHUNK_ENDED = 3


def _cmd_experiment(args: argparse.Namespace) -> int:
    from exhume.experiments import get_experiment
    from exhume.experiments.registry import ChunkEnd, chunk_deadline
    from exhume.files.runfolder import LOCK_NAME, refuse_existing

    out = Path(args.out)
    try:
        with chunk_deadline(getattr(args, "chunk_seconds", None)):
            if out.is_dir():  # an earlier run's results are reused only with --resume, replaced only with --force
                earlier = tuple(sorted(p.name for p in out.iterdir() if not p.name.startswith(LOCK_NAME)))
                refuse_existing(out, earlier, args.force or getattr(args, "resume", False), "an earlier run", can_resume=True)
            result = get_experiment(args.experiment).run(args)
    except ChunkEnd:
        print(f"exhume experiment {args.experiment}: this chunk's {args.chunk_seconds:g} s are up; finished cases, the "
              f"victim in training and the attack in progress are checkpointed in {args.out}: run the same command "
              "with --resume to continue", file=sys.stderr)
        return CHUNK_ENDED
    print(json.dumps(result, indent=2, default=str, ensure_ascii=False))
    return 0


COMMANDS = {"demo": _cmd_demo, "train": _cmd_train, "attack": _cmd_attack, "evaluate": _cmd_evaluate,
            "experiment": _cmd_experiment, "tune": _cmd_tune, "report": _cmd_report, "audit": _cmd_audit}


def list_params(method: str) -> str:
    """The attack's parameters as a table: name, default, allowed range, meaning."""
    from exhume.attacks import ATTACKS

    if method not in ATTACKS:
        raise ConfigError(f"unknown attack method {method!r}; known: {', '.join(sorted(ATTACKS))}")
    rows = []
    for name, prm in ATTACKS[method].params.items():
        rows.append((name, repr(prm.default), prm.range_text(), prm.help))
    w = [max(len(r[i]) for r in rows + [("name", "default", "range", "")]) for i in range(3)]
    head = f"{'name':<{w[0]}}  {'default':<{w[1]}}  {'range':<{w[2]}}  meaning"
    presets = [f"{name}: " + ", ".join(f"{k}={v!r}" for k, v in settings.items()) for name, settings in ATTACKS[method].presets.items()]
    return "\n".join([f"parameters of the {method!r} attack (set with -p NAME=VALUE):", head]
                     + [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows]
                     + (["presets (--preset NAME; -p settings beside it win):", *presets] if presets else []))


def _list_params_early(argv: Sequence[str]) -> int | None:
    """``exhume attack [--method M] --list-params`` needs no victim or output folder."""
    if len(argv) < 1 or argv[0] != "attack" or "--list-params" not in argv:
        return None
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method", default=DEFAULT_METHOD)
    known, _ = pre.parse_known_args(list(argv[1:]))
    try:
        print(list_params(known.method))
    except ExhumeError as e:
        print(f"exhume attack: error: {e}", file=sys.stderr)
        return 2
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is (so a long run checkpoints as on Ctrl-C)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _os_error_line(e: OSError) -> str:
    where = f"{e.filename}: " if e.filename else ""
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        return f"{where}{e.strerror}; expected a folder path (or a path that does not exist yet)"
    return f"{where}{e.strerror or e}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early = _list_params_early(argv)
    if early is not None:
        return early
    parser = build_parser()
    args = parser.parse_args(argv)
    import signal
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return COMMANDS[args.command](args)
    except ExhumeError as e:
        print(f"exhume {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a read-only or full output folder, a file where a folder is expected
        print(f"exhume {args.command}: error: {_os_error_line(e)}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"exhume {args.command}: terminated (SIGTERM); an attack run continues with --resume from its last checkpoint", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"exhume {args.command}: interrupted; an attack run continues with --resume from its last checkpoint", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
