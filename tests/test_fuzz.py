"""Hostile files and faults (issue 12): every case ends in exit 2 and one line, writes nothing
outside its output folder, and stays under a stated memory bound.

The cases run through ``exhume.cli.main`` in a child process started by this file (``python
tests/test_fuzz.py CASES.json``): one child for the cheap cases, one for the memory bombs (gzip
and PNG files of a few MB that declare or inflate to GBs), each under an address-space limit of
6 GiB (importing torch alone takes about 3.5 GB of address space) and each reporting its peak
resident memory (``ru_maxrss``) after every case.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ADDRESS_SPACE = 6 << 30  # bytes, the child's RLIMIT_AS
PEAK_RSS_BOUND_MB = 1000  # every case, torch imported (measured: 340-500 MB); printed with EXHUME_FUZZ_VERBOSE=1

# ------------------------------------------------------------------------------ hostile file makers

_ZEROS_MEMBER = gzip.compress(b"\0" * (1 << 20), compresslevel=9)  # one gzip member: 1 MiB of zeros in ~1 KB


def gzip_bomb(path: Path, head: bytes, mib: int) -> None:
    """A gzip file of ``head`` followed by ``mib`` MiB of zeros (concatenated members, ~1 KB per MiB)."""
    path.write_bytes(gzip.compress(head) + _ZEROS_MEMBER * mib)


def idx_header(magic: int, dims: tuple[int, ...]) -> bytes:
    return struct.pack(">I", magic) + struct.pack(f">{len(dims)}I", *dims)


def png_1bit(path: Path, w: int, h: int) -> None:
    """An all-black 1-bit PNG of w x h pixels, written without ever holding its pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    comp = zlib.compressobj(9)
    row = b"\0" * (1 + (w + 7) // 8)
    idat = b"".join(comp.compress(row) for _ in range(h)) + comp.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def npy_bytes(header: str, data: bytes = b"", version: int = 1) -> bytes:
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header.encode() + data


# ------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two tiny victims and a finished attack run on the first."""
    import exhume
    from exhume.victim import TrainConfig, make_victim

    root = tmp_path_factory.mktemp("fuzz")
    cfg = TrainConfig(loss="logistic", optimizer="gd", lr=0.2, weight_decay=5e-3, max_epochs=30, max_seconds=10)
    for seed in (0, 1):
        torch.manual_seed(seed)
        make_victim("mnist", "odd-even", 10, "mlp:16;bias=none;init=1e-3", cfg, seed=seed, progress=False,
                    test_size=20).save(root / f"victim{seed}")
    exhume.attack(exhume.load_victim(root / "victim0"), out=root / "run", iterations=3, progress=False, restarts=1)
    return root


def _victim_variant(world: Path, case: Path, edit=None, meta_text: str | None = None) -> Path:
    import shutil

    v = case / "victim"
    shutil.copytree(world / "victim0", v)
    if meta_text is not None:
        (v / "victim.json").write_text(meta_text)
    elif edit is not None:
        meta = json.loads((v / "victim.json").read_text())
        edit(meta)
        (v / "victim.json").write_text(json.dumps(meta))
    return v


def _run_variant(world: Path, case: Path) -> Path:
    import shutil

    run = case / "run"
    shutil.copytree(world / "run", run)
    return run


def _cheap_cases(world: Path, base: Path) -> list[dict]:
    """(name, argv, out) of every cheap hostile input; files are built under base/NAME."""
    cases: list[dict] = []

    def case(name: str) -> Path:
        d = base / name
        d.mkdir()
        return d

    def add(name: str, argv: list[str], out: Path, **extra) -> None:
        cases.append({"name": name, "argv": [str(a) for a in argv], "out": str(out), **extra})

    def attack_case(name: str, edit=None, meta_text=None, files=None):
        d = case(name)
        v = _victim_variant(world, d, edit, meta_text)
        for fname, data in (files or {}).items():
            (v / fname).write_bytes(data)
        add(name, ["attack", v, "-o", d / "out", "--iterations", "2", "--restarts", "1", "--no-progress"], d / "out")

    # victim.json
    attack_case("victim_json_is_5", meta_text="5")
    attack_case("victim_json_deeply_nested", meta_text='{"arch": ' + "[" * 100_000 + "]" * 100_000 + "}")
    attack_case("victim_json_nested_40", meta_text='{"arch": {"type": "mlp", "widths": [16], "x": ' + "[" * 40 + "]" * 40 + "}}")
    attack_case("input_shape_string", lambda m: m.update(input_shape=["a", 28, 28]))
    attack_case("arch_is_string", lambda m: m.update(arch="mlp"))
    attack_case("widths_strings", lambda m: m["arch"].update(widths=["x"]))
    attack_case("widths_float", lambda m: m["arch"].update(widths=[16.5]))
    attack_case("widths_huge", lambda m: m["arch"].update(widths=[1_000_000, 256]))
    attack_case("widths_huger", lambda m: m["arch"].update(widths=[10**7, 256]))
    attack_case("num_classes_string", lambda m: m.update(task="multiclass", num_classes="ten"))
    attack_case("weight_decay_string", lambda m: m.update(weight_decay="big"))
    attack_case("weight_decay_negative", lambda m: m.update(weight_decay=-1))
    d = _victim_variant(world, case("weight_decay_infinity_probe"))  # JSON's non-standard Infinity token
    attack_case("weight_decay_infinity", meta_text=(d / "victim.json").read_text().replace('"weight_decay": 0.005', '"weight_decay": Infinity'))
    # train_indices.npy
    attack_case("npy_empty", files={"train_indices.npy": b""})
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (%s,), }"
    attack_case("npy_truncated", files={"train_indices.npy": npy_bytes((header % 10).ljust(117) + "\n", b"\0" * 16)})
    attack_case("npy_huge_header", files={"train_indices.npy": npy_bytes("{" + " " * 200_000 + "}\n", version=2)})
    attack_case("npy_huge_shape", files={"train_indices.npy": npy_bytes((header % 10_000_000_000).ljust(117) + "\n")})
    attack_case("npy_object", files={"train_indices.npy": npy_bytes("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }".ljust(117) + "\n", b"\0" * 8)})
    # a NaN data mean: a data error, not a "diverged" attack
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(world / "victim0" / "model.safetensors"))
    tensors["__data_mean__"] = torch.full_like(tensors["__data_mean__"], float("nan"))
    d = case("nan_data_mean")
    v = _victim_variant(world, d)
    save_file(tensors, str(v / "model.safetensors"))
    add("nan_data_mean", ["attack", v, "-o", d / "out", "--iterations", "2", "--restarts", "1", "--no-progress"], d / "out", expect="data mean")

    # checkpoints (resume)
    def ckpt_case(name: str, payload, expect: str | None = None):
        d = case(name)
        run = d / "run"
        run.mkdir()
        torch.save(payload, run / "checkpoint.pt")
        add(name, ["attack", world / "victim0", "-o", run, "--iterations", "5", "--resume", "--restarts", "1", "--no-progress"], run, expect=expect)

    good = torch.load(world / "run" / "checkpoint.pt", weights_only=True)
    ckpt_case("checkpoint_is_list", [1, 2, 3])
    ckpt_case("checkpoint_lacks_keys", {"tensors": good["tensors"]}, "optimizers")
    ckpt_case("checkpoint_iteration_huge", {**good, "state": {**good["state"], "iteration": 10**9}}, "iteration")
    ckpt_case("checkpoint_iteration_negative", {**good, "state": {**good["state"], "iteration": -100}}, "iteration")
    ckpt_case("checkpoint_iteration_float", {**good, "state": {**good["state"], "iteration": 1e9}}, "iteration")
    ckpt_case("checkpoint_other_victim", {**good, "victim": "0123456789abcdef"}, "another victim")
    d = case("resume_without_checkpoint")
    add(d.name, ["attack", world / "victim0", "-o", d / "run", "--iterations", "5", "--resume", "--restarts", "1", "--no-progress"], d / "run",
        expect="does not exist")

    # reconstructions, data specs, metrics
    d = case("recon_without_method")
    run = _run_variant(world, d)
    meta = json.loads((run / "reconstruction.json").read_text())
    del meta["method"]
    (run / "reconstruction.json").write_text(json.dumps(meta))
    add(d.name, ["evaluate", run, "--against", world / "victim0", "-o", d / "out"], d / "out", expect="method")
    d = case("recon_without_labels")
    run = _run_variant(world, d)
    t = load_file(str(run / "reconstruction.safetensors"))
    save_file({"candidates": t["candidates"]}, str(run / "reconstruction.safetensors"))
    add(d.name, ["evaluate", run, "--against", world / "victim0", "-o", d / "out"], d / "out", expect="labels")
    for name, n in (("data_spec_n_string", '"abc"'), ("data_spec_n_nan", "NaN")):
        d = case(name)
        v = _victim_variant(world, d)
        text = (v / "victim.json").read_text()
        meta = json.loads(text)
        meta["data_spec"]["n"] = "__N__"
        (v / "victim.json").write_text(json.dumps(meta).replace('"__N__"', n))
        add(name, ["evaluate", world / "run", "--against", v, "-o", d / "out"], d / "out", expect="'data_spec.n'")
    d = case("metrics_string_counts")
    run = _run_variant(world, d)
    (run / "evaluation").mkdir()
    (run / "evaluation" / "metrics.json").write_text(json.dumps({"n_train": 10, "memorised": "5", "memorised_control": "1", "control_size": 10}))
    add(d.name, ["report", run, "-o", d / "out" / "report.html"], d / "out", expect="memorised")
    d = case("pool_size_negative")
    add(d.name, ["evaluate", world / "run", "--against", world / "victim0", "--pool-size", "-5", "-o", d / "out"], d / "out", expect="--pool-size")

    # output folders: an existing file, a read-only location, a full disk (RLIMIT_FSIZE)
    for cmd in ("attack", "train", "evaluate"):
        d = case(f"out_is_file_{cmd}")
        (d / "file").write_text("x")
        argv = {"attack": ["attack", world / "victim0", "-o", d / "file", "--iterations", "2", "--restarts", "1", "--no-progress"],
                "train": ["train", "-o", d / "file", "-n", "10", "--arch", "mlp:8", "--epochs", "2", "--no-progress"],
                "evaluate": ["evaluate", world / "run", "--against", world / "victim0", "-o", d / "file", "--pool-size", "20"]}[cmd]
        add(d.name, argv, d / "file")
    d = case("out_read_only")
    add(d.name, ["attack", world / "victim0", "-o", "/sys/exhume-fuzz/run", "--iterations", "2", "--restarts", "1", "--no-progress"], d / "out")
    d = case("out_disk_full")
    add(d.name, ["attack", world / "victim0", "-o", d / "run", "--iterations", "2", "--restarts", "1", "--no-progress"], d / "run", fsize=4096)
    return cases


def _bomb_cases(base: Path) -> list[dict]:
    cases: list[dict] = []

    def add(name: str, argv: list, out: Path, expect: str) -> None:
        cases.append({"name": name, "argv": [str(a) for a in argv], "out": str(out), "expect": expect})

    def train(name: str, data: str, root: Path, expect: str) -> None:
        add(name, ["train", "--data", data, "--root", root, "-n", "10", "--arch", "mlp:8", "--epochs", "2",
                   "-o", base / name / "out", "--no-progress"], base / name / "out", expect)

    labels = gzip.compress(idx_header(0x801, (10,)) + bytes(10))
    for name, head, mib, expect in (
        ("idx_2gib_of_zeros", b"", 2048, "magic"),  # head -c 2G /dev/zero | gzip
        ("idx_valid_header_2gib_trailing", idx_header(0x803, (10, 28, 28)) + bytes(7840), 2048, "trailing"),
        ("idx_header_declares_2tb", idx_header(0x803, (60000, 20000, 2000)), 1, "declare"),
    ):
        d = base / name
        d.mkdir()
        gzip_bomb(d / "train-images-idx3-ubyte.gz", head, mib)
        (d / "train-labels-idx1-ubyte.gz").write_bytes(labels)
        train(name, "mnist", d, expect)
    d = base / "cifar_3gib_member"
    d.mkdir()
    info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
    info.size = 3 << 30
    gzip_bomb(d / "cifar-10-python.tar.gz", info.tobuf(format=tarfile.GNU_FORMAT), 3072)
    train(d.name, "cifar10", d / "cifar-10-python.tar.gz", "declares")
    for name, size, count, expect in (("png_20000_squared", 20000, 1, "pixels"), ("png_three_9000_squared", 9000, 3, "pixels")):
        d = base / name
        for i in range(count):
            (d / "imgs" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            png_1bit(d / "imgs" / f"c{i % 2}" / f"{i}.png", size, size)
        train(name, "folder", d / "imgs", expect)
    return cases


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.lstat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def _run_children(cases: list[dict], root: Path, tmp_path: Path) -> list[dict]:
    spec = tmp_path / f"cases-{len(os.listdir(tmp_path))}.json"
    spec.write_text(json.dumps({"root": str(root), "cases": cases}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    proc = subprocess.run([sys.executable, __file__, str(spec)], env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=limit, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _check(results: list[dict], cases: list[dict]) -> None:
    if os.environ.get("EXHUME_FUZZ_VERBOSE"):  # pytest -s: each case's exit code, peak RSS and message
        for r in results:
            print(f"{r['name']:32s} rc={r['rc']} peak={r['maxrss_mb']} MB  {r['err'].strip()[:220]}")
    assert [r["name"] for r in results] == [c["name"] for c in cases]
    bad = []
    for r, c in zip(results, cases):
        lines = r["err"].strip().splitlines()
        ok = (r["rc"] == 2 and len(lines) == 1 and "Traceback" not in r["err"] and lines[0].startswith("exhume ")
              and not r["outside"] and not r["tmp_left"] and r["maxrss_mb"] < PEAK_RSS_BOUND_MB
              and (c.get("expect") is None or c["expect"] in lines[0]))
        if not ok:
            bad.append(r)
    assert not bad, json.dumps(bad, indent=1)[-6000:]


def test_hostile_inputs_end_in_one_line_and_exit_2(world, tmp_path):
    base = world / "cheap"
    base.mkdir()
    cases = _cheap_cases(world, base)
    results = _run_children(cases, world, tmp_path)
    _check(results, cases)
    assert not (base / "out_disk_full" / "run" / "checkpoint.pt").exists()


def test_memory_bombs_are_refused_before_allocation(world, tmp_path):
    base = world / "bombs"
    base.mkdir()
    cases = _bomb_cases(base)
    assert sum(f.stat().st_size for f in base.rglob("*") if f.is_file()) < 40 << 20  # small on disk
    results = _run_children(cases, world, tmp_path)
    _check(results, cases)


def test_evaluation_blocks_equal_the_whole_matrix_and_one_to_one_is_capped(monkeypatch):
    """exhume evaluate's nearest matches and distances, computed in column blocks (bounded memory),
    equal those of the whole similarity matrix; the Hungarian matching refuses a matrix past its cap."""
    import dataclasses

    from exhume.errors import DataError
    from exhume.evaluation import matching
    from exhume.evaluation.matching import (
        best_match,
        match,
        min_distances,
        rule_similarity,
    )

    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(7, 1, 8, 8, generator=g), torch.rand(23, 1, 8, 8, generator=g)
    whole = {rule: best_match(rule_similarity(a, b, rule)) for rule in ("ssim", "l2", "ncc")}
    full_d = torch.cdist(a.reshape(7, -1).double(), b.reshape(23, -1).double())
    monkeypatch.setattr(matching, "LIMITS", dataclasses.replace(matching.LIMITS, candidates_x_pool_block=20, one_to_one_entries=100))
    for rule, (idx, val) in whole.items():  # 20 entries per block: 2 columns of 7 rows at a time
        res = match(a, b, rule, one_to_one_too=False)
        assert np.array_equal(res["best"], idx), rule
        if rule == "ssim":
            assert np.allclose(res["ssim"], val, atol=1e-6)
    rows, cols = min_distances(a, b)
    assert torch.allclose(rows, full_d.min(1).values) and torch.allclose(cols, full_d.min(0).values)
    with pytest.raises(DataError, match="one-to-one"):
        match(a, b, "ssim", one_to_one_too=True)  # 7 x 23 = 161 pairs > 100


# ------------------------------------------------------------------------ the child process side

def _child(spec_path: str) -> None:
    import contextlib
    import io
    import signal
    import traceback

    from exhume.cli import main

    spec = json.loads(Path(spec_path).read_text())
    root = Path(spec["root"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a full disk: writes fail with EFBIG instead of a signal
    for case in spec["cases"]:
        before = _snapshot(root)
        err, out = io.StringIO(), io.StringIO()
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        if case.get("fsize"):
            resource.setrlimit(resource.RLIMIT_FSIZE, (case["fsize"], hard))
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                rc = main(case["argv"])
        except SystemExit as e:
            rc = e.code
        except BaseException:  # noqa: BLE001 - recorded, the test fails on it
            rc = "crash"
            err.write(traceback.format_exc())
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        after = _snapshot(root)
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        outside = sorted(p for p in changed if not p.startswith(case["out"]))
        tmp_left = sorted(p for p in after if p.endswith(".tmp"))
        print(json.dumps({"name": case["name"], "rc": rc, "err": err.getvalue(), "outside": outside, "tmp_left": tmp_left,
                          "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1])
