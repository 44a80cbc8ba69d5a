"""``exhume experiment dp``: what differential privacy buys against reconstruction, measured as DP is measured.

Victims (:mod:`.cli`) trained at each privacy level through Opacus (the noise seeded and recorded: research
victims), each attacked uninformed (one kkt run, :mod:`.cells`) and by the informed adversary (:mod:`.informed`),
each rate with its 95 % interval beside the exact bound for the victim's own σ, q, T (:mod:`.pooling`); the table,
figure and files (:mod:`.report`). docs/METHODS.md §7; finished cells are reused with ``--resume``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from exhume.experiments.dp.cli import FLAGS, HELP, add_arguments, levels, settings
from exhume.experiments.registry import command_line, register_experiment
from exhume.files.jsonio import read_json, write_json


def run_cell(setting: str, level: str, seed: int, s: dict, out: Path, resume: bool, device: str, progress: bool) -> dict:
    """Train, attack (uninformed and informed) and judge one (setting, privacy level, seed); saved in ``cells/<key>/row.json``."""
    from exhume.experiments.dp.cells import attack_cell, uninformed_row, victim_of
    from exhume.experiments.dp.informed import informed_cell

    folder = out / "cells" / f"{setting}_{level}_s{seed}"
    if resume and (folder / "row.json").is_file():
        return read_json(folder / "row.json", what="a row written by exhume experiment dp")
    t0 = time.perf_counter()
    victim = victim_of(setting, level, seed, s, folder / "victim", resume, progress)
    trained = time.perf_counter()
    recon = attack_cell(victim, setting, seed, s, folder / "attack", resume, device, progress)
    attacked = time.perf_counter()
    row = {**uninformed_row(victim, recon, setting, level, seed, s), **informed_cell(victim, recon, setting, level, seed, s),
           "train_seconds": round(trained - t0, 1), "attack_seconds": round(attacked - trained, 1),
           "informed_seconds": round(time.perf_counter() - attacked, 1)}
    write_json(folder / "row.json", row)
    if progress:
        games = ", ".join(f"k={k} {row[f'game_{k}']}" for k in s["games"])
        print(f"  {setting:9s} {level:>6s} seed {seed}: memorised {row['memorised']}/{s['n']} (control {row['control']}); informed "
              f"{row['reconstructed']}/{row['targets']} (control {row['controls_matched']}), game {games}; "
              f"{row['train_seconds'] + row['attack_seconds'] + row['informed_seconds']:.0f} s", flush=True)
    return row


@register_experiment("dp", HELP, add_arguments)
def run(args: argparse.Namespace) -> dict[str, Any]:
    from exhume.experiments.dp.pooling import curve, findings, with_bounds
    from exhume.experiments.dp.report import write
    from exhume.victim.private import require_opacus

    s = settings(args)
    require_opacus()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, progress, rows = time.perf_counter(), not args.no_progress, []
    for setting in s["settings"]:
        for seed in s["seeds"]:
            for level in levels(s):
                rows.append(run_cell(setting, level, seed, s, out, args.resume, getattr(args, "device", "cpu"), progress))
    rows = with_bounds(rows, s["games"])
    points = curve(rows, s["games"])
    found = findings(points, s["games"])
    command = command_line("dp", args, FLAGS, ["--no-clip-only"] if getattr(args, "no_clip_only", False) else [])
    result = write(rows, points, found, s, out, command, time.perf_counter() - t0)
    result["paper_finding"] = ("DP-SGD bounds what an informed adversary reconstructs (Balle et al. 2022; Hayes et al. 2023): "
                               "success at most the bound for the mechanism's own σ, q, T, which tends to the prior's κ as ε falls")
    return result
