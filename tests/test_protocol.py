"""The protocol between the attacks and the rooms above them, and the audit's one configuration.

Every registered attack declares what the audit, the evaluation, the portfolio and tune read from it;
no room above names an attack; the attacks import nothing that holds the training set and are handed
the training images by no evaluator; the audit's settings read the same from a TOML file, flags and Python.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _start_cases import fine_tuned
from torch import nn

import exhume
from exhume.attacks import ATTACKS, Attack, Equation, RestartPlan, SolvedEquation, Stationarity, get_attack, register
from exhume.attacks.engine.base import NO_STEP_LIMIT
from exhume.attacks.kkt import KKTAttack
from exhume.audit.config import FILE_SETTINGS, SETTINGS, AuditConfig, from_command, from_options
from exhume.cli import build_parser, main
from exhume.errors import ConfigError
from exhume.evaluation.assumptions import equation_of
from exhume.evaluation.run import victim_failures
from exhume.portfolio import DEFAULT_VARIANTS, has_plan, make_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_every_registered_attack_declares_the_protocol(name):
    cls = ATTACKS[name]
    declared = next(c for c in cls.__mro__ if "equation" in vars(c))
    assert declared is not Attack and isinstance(cls.equation, Equation)  # chosen by the attack, not inherited from the base
    assert cls.budget in cls.params and isinstance(cls.multipliers, bool)
    atk = get_attack(name, **cls.by_deadline())  # a run its deadline alone bounds is a valid setting
    assert atk.config[cls.budget] == NO_STEP_LIMIT
    for pname, (lo, hi, _) in cls.search_space().items():
        assert cls.params[pname].validate(pname, lo) == lo and cls.params[pname].validate(pname, hi) == hi
    count = atk.candidate_count(50)
    assert count is None or (isinstance(count, int) and count >= 1)
    assert cls.restart_plan is None or isinstance(cls.restart_plan, RestartPlan)
    assert has_plan(name) == (cls.restart_plan is not None) == (name in DEFAULT_VARIANTS)
    for variant in (cls.restart_plan or RestartPlan()).variants:
        get_attack(name, **variant)  # every variant is a valid setting of the attack


def test_the_declarations_say_what_the_rooms_used_to_hard_code():
    kkt, bilevel = ATTACKS["kkt"], ATTACKS["bilevel"]
    assert get_attack("kkt").candidate_count(30) == 60 and get_attack("kkt", m=7).candidate_count(30) == 7
    assert get_attack("kkt", candidates_per_point=1.5, n_guess=10).candidate_count(30) == 15
    assert get_attack("bilevel").candidate_count(30) == 30 and get_attack("bilevel", n_guess=12).candidate_count(30) == 12
    assert kkt.equation.multiplier_scale and not bilevel.equation.multiplier_scale
    assert type(ATTACKS["tldr"].equation) is Equation  # model inversion inverts no equation of weights and data
    assert kkt.search_space() and not bilevel.search_space()
    assert [dict(v) for v in kkt.restart_plan.variants] == [{}, {"lr_lambda": 1e-2}]


class _Unmodelled(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.Dropout(0.5), nn.Tanh(), nn.Linear(3, 1))

    def forward(self, x):
        return self.body(x)


def test_the_evaluation_checks_what_the_attacks_equation_assumes():
    victim = SimpleNamespace(model=_Unmodelled(), metrics={"stationarity_residual": 3.0})
    train = SimpleNamespace(centred=torch.zeros(2, 1, 2, 2))
    stationarity = victim_failures(victim, train, equation_of("kkt"))
    assert len(stationarity) == 3 and "dropout" in stationarity[0] and "tanh" in stationarity[1] and "3 > 0.5" in stationarity[2]
    assert victim_failures(victim, train, equation_of("inversion")) == []  # it assumes none of it
    assert equation_of("an-attack-this-process-never-registered") == Stationarity()  # unknown: every check


def test_a_new_attack_plugs_into_the_rooms_by_declaring_it(tmp_path):
    """A subclass declaring a plan, an equation and no search space: the portfolio, evaluation and tune follow."""

    class Plugged(KKTAttack):
        name = "plugged-kkt"
        equation = Equation()
        restart_plan = RestartPlan(variants=({}, {"alpha": 10.0}, {"alpha": 30.0}))
        params = {k: dataclasses.replace(p, search=None) for k, p in KKTAttack.params.items()}

    register(Plugged)
    try:
        assert has_plan("plugged-kkt") and DEFAULT_VARIANTS["plugged-kkt"][2] == {"alpha": 30.0}
        plan = make_plan("plugged-kkt", 3, attack_kwargs={"iterations": 5})
        assert [r.overrides for r in plan.restarts] == [{}, {"alpha": 10.0}, {"alpha": 30.0}]
        assert equation_of("plugged-kkt") == Equation()
        from exhume.tune.study import _searchable
        from exhume.victim import AttackerView

        view = AttackerView(model=nn.Linear(4, 1), task="binary", input_shape=(4,), mean=torch.zeros(4), loss="logistic")
        with pytest.raises(ConfigError, match="'plugged-kkt' attack declares no search space.*declare one: kkt"):
            _searchable(view, 2, 1.0, {}, "plugged-kkt")
    finally:
        ATTACKS.pop("plugged-kkt")


def test_tune_on_an_attack_without_a_search_space_refuses_in_one_line(tmp_path, capsys):
    from exhume.victim import TrainConfig, make_victim

    cfg = TrainConfig(loss="logistic", optimizer="gd", lr=0.2, weight_decay=5e-3, max_epochs=5, max_seconds=5)
    make_victim("mnist", "odd-even", 8, "mlp:8;bias=none", cfg, seed=0, progress=False, test_size=0).save(tmp_path / "v")
    assert main(["tune", str(tmp_path / "v"), "--method", "bilevel", "--trials", "2", "-o", str(tmp_path / "t"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'bilevel' attack declares no search space" in err[0]
    assert not (tmp_path / "t" / "tune.db").exists()


# -- no room above the attacks names one -------------------------------------------------------------------

def _name_uses(path: Path, names: set[str]):
    """``(line, context)`` of every string constant in ``path`` that equals an attack's name (docstrings aside)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names:
            yield node.lineno, _context(node)


def _context(node) -> str:
    parent = node.parent
    holder = parent.parent if isinstance(parent, (ast.Tuple, ast.List, ast.Set)) else parent
    if isinstance(holder, ast.Compare) or isinstance(parent, ast.match_case) or isinstance(holder, ast.MatchValue):
        return "compared"
    if isinstance(parent, ast.Dict) and node in parent.keys:
        return "dict key"
    if isinstance(parent, ast.Subscript) and parent.slice is node:
        return "looked up"
    if isinstance(parent, ast.arguments):
        return "default"
    if isinstance(parent, ast.keyword) and parent.arg in ("default", "method"):
        return "default"
    if isinstance(parent, ast.Call) and getattr(parent.func, "id", None) in ("setting", "field"):
        return "default"  # a settings field's default
    if isinstance(parent, ast.Call):
        return "call argument"
    if isinstance(holder, ast.Assign) and isinstance(holder.parent, ast.Module):
        return "module constant"
    return type(parent).__name__


def test_no_room_above_the_attacks_compares_against_or_branches_on_an_attacks_name():
    """Outside exhume/attacks/ an attack's name appears only as a default choice. The experiments, which reproduce
    a paper's experiment on named attacks, may also pass one to the attack they run or list theirs in a constant."""
    names = set(ATTACKS)
    found = []
    for path in sorted((ROOT / "exhume").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "attacks":
            continue
        allowed = {"default"} | ({"call argument", "module constant"} if rel.parts[1] == "experiments" else set())
        found += [f"{rel}:{line} ({how})" for line, how in _name_uses(path, names) if how not in allowed]
    assert found == []


def test_no_room_above_the_attacks_compares_against_a_value_an_attack_owns():
    """The equation a run solved is a :class:`SolvedEquation` above ``exhume/attacks/``, never its spelling (spelled
    where it is defined, ``exhume/equations/``, and by the attacks that solve it)."""
    owned = {e.value for e in SolvedEquation}
    found = []
    for path in sorted((ROOT / "exhume").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] not in ("attacks", "equations"):
            found += [f"{rel}:{line} ({how})" for line, how in _name_uses(path, owned) if how != "default"]
    assert found == []


#: an attack's own validated settings (``Attack.config``) and argparse's --config are no run record
_NOT_A_RECORD = ("args", "atk", "attack")


def _record_reads(path: Path):
    """``(line, what)`` of every read of a run record's raw dicts: ``x.summary``, ``x.config`` (but an attack's
    settings or ``args.config``), ``getattr(x, "summary"/"config")``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "summary":
            yield node.lineno, ".summary"
        elif isinstance(node, ast.Attribute) and node.attr == "config":
            owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", None)
            if owner not in _NOT_A_RECORD:
                yield node.lineno, ".config"
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr") and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in ("summary", "config")):
            yield node.lineno, f"getattr {node.args[1].value!r}"


def test_no_room_above_the_attacks_reads_a_run_record_by_key():
    """Above ``exhume/attacks/`` a Reconstruction's record is read as ``recon.record`` (a typed RunRecord), never
    ``recon.summary[...]``/``recon.config.get(...)`` (the JSON views made from it, for files); the portfolio builds its
    pooled record as objects."""
    found = []
    for path in sorted((ROOT / "exhume").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[1] != "attacks":
            found += [f"{rel}:{line} ({what})" for line, what in _record_reads(path)]
    assert found == []


def test_the_record_test_sees_a_key_read_a_get_and_a_getattr(tmp_path):
    code = ('def f(recon, atk, args):\n    a = recon.summary["iterations"] + atk.config["lr"]\n'
            '    b = (recon.config or {}).get("init"), args.config\n    return getattr(recon, "config", None), "stationary" == a\n')
    (tmp_path / "m.py").write_text(code)
    assert sorted(_record_reads(tmp_path / "m.py")) == [(2, ".summary"), (3, ".config"), (4, "getattr 'config'")]
    assert list(_name_uses(tmp_path / "m.py", {e.value for e in SolvedEquation})) == [(4, "compared")]


def test_the_name_test_sees_a_comparison_a_lookup_and_a_table(tmp_path):
    code = 'def f(method, table):\n    if method == "kkt" or method in ("bilevel", "x"):\n        return table["kkt"]\n    return {"tldr": 1}\n'
    (tmp_path / "m.py").write_text(code)
    assert sorted(_name_uses(tmp_path / "m.py", set(ATTACKS))) == [(2, "compared"), (2, "compared"), (3, "looked up"), (4, "dict key")]


# -- the attacks never read the training set: a rule of the imports and of the calls --------------------------

#: the rooms an attack must not import: the evaluation (it holds the training set), the data loaders, the victim room (a
#: Victim holds the training indices and loads the training set) and every room above the attacks
_ABOVE_THE_ATTACKS = ("exhume.evaluation", "exhume.data", "exhume.victim", "exhume.request", "exhume.tune", "exhume.portfolio",
                      "exhume.api", "exhume.report", "exhume.audit", "exhume.demo", "exhume.experiments", "exhume.cli")


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports, at its top or inside a function."""
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_the_attacks_import_nothing_that_holds_the_training_set():
    found = sorted(f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / "exhume" / "attacks").rglob("*.py") for m in _imports(p)
                   if m.startswith(_ABOVE_THE_ATTACKS))
    assert found == []


def test_the_equations_read_the_weights_alone_below_the_attacks_and_the_evaluation():
    """``exhume/equations/``, which the attacks solve and the evaluation checks, imports neither of them nor anything that
    holds the training set (the data loaders, the victim room) or stands above them."""
    below = ("exhume.attacks", *_ABOVE_THE_ATTACKS)
    found = sorted(f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / "exhume" / "equations").rglob("*.py") for m in _imports(p)
                   if m.startswith(below) or m == "exhume")
    assert found == []
    users = {room: any(m.startswith("exhume.equations") for p in (ROOT / "exhume" / room).rglob("*.py") for m in _imports(p))
             for room in ("attacks", "evaluation")}
    assert users == {"attacks": True, "evaluation": True}  # one module of equations that both sides import


_ATTACKS_DIR = str(ROOT / "exhume" / "attacks")
_EXHUME_DIR = str(ROOT / "exhume")
#: pixels 0-3 of every training image: a, a + d, a + 3d, a − 2d, ratios that centring, scaling and casting keep
_MARK = (0.41, 0.0937)
_SIZE = 16  # pixels of one 1×4×4 image


def _marked(images: torch.Tensor) -> torch.Tensor:
    a, d = _MARK
    out = images.clone()
    out.reshape(len(out), -1)[:, :4] = torch.tensor([a, a + d, a + 3 * d, a - 2 * d])
    return out


def _carries_training_images(value, depth: int = 0) -> bool:
    """Whether ``value`` (a tensor, or a tuple, list or dict of them) holds rows of a training image's pixels, as
    displayed, centred, scaled, sliced or cast: rows whose pixels 0-3 keep :data:`_MARK`'s ratios."""
    if isinstance(value, (tuple, list)) and depth < 2:
        return any(_carries_training_images(v, depth + 1) for v in value)
    if isinstance(value, dict) and depth < 2:
        return any(_carries_training_images(v, depth + 1) for v in value.values())
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() == 0 or value.numel() % _SIZE:
        return False
    try:
        rows = value.detach().reshape(-1, _SIZE)[:, :4].double().cpu()
        step = (rows[:, 1:2] - rows[:, :1]).clamp_min(1e-9)  # the mark's step is positive
        ratios = (rows[:, 2:] - rows[:, :1]) / step
        return bool(((ratios - torch.tensor([3.0, -2.0], dtype=torch.float64)).abs().amax(1) < 1e-4).any())
    except Exception:  # noqa: BLE001 - a tensor inside a torch.func transform: not one an evaluator hands over
        return False


class _Calls:
    """``sys.setprofile`` on the functions of ``exhume/attacks/``: ``ran``, those run inside ``exhume.attack`` (an attack
    on its own view and candidates); ``handed``, those called from outside the attacks (no frame of ``exhume/attacks/``
    above them) with an argument that :func:`_carries_training_images`, and the exhume module that called them."""

    def __init__(self) -> None:
        import exhume.api

        self.entry, self.depth = exhume.api.attack.__code__, 0
        self.ran: set = set()
        self.handed: dict = {}

    def __call__(self, frame, event, arg) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        if code is self.entry:
            self.depth += 1 if event == "call" else -1
        if event != "call" or not code.co_filename.startswith(_ATTACKS_DIR):
            return
        if self.depth > 0:
            self.ran.add(code)
            return
        above, caller = frame.f_back, None
        while above is not None:
            if above.f_code.co_filename.startswith(_ATTACKS_DIR):
                return  # the attacks' own code runs it: only the first call into exhume/attacks/ is a hand-over
            if caller is None and above.f_code.co_filename.startswith(_EXHUME_DIR):
                caller = above.f_code.co_filename
            above = above.f_back
        if any(_carries_training_images(v) for v in frame.f_locals.values()):
            self.handed[code] = "the test" if caller is None else str(Path(caller).relative_to(ROOT))

    def offenders(self) -> list[str]:
        return sorted(f"{Path(c.co_filename).relative_to(ROOT)}:{c.co_qualname}, called by {who}"
                      for c, who in self.handed.items())


def test_the_mark_is_seen_in_training_images_however_they_are_passed_and_nowhere_else():
    x = _marked(torch.rand(5, 1, 4, 4, generator=torch.Generator().manual_seed(0)))
    assert all(_carries_training_images(v) for v in ((x - 0.5) / 0.3, x.double()[2:3], x.flatten(1), (x[:2], None), {"a": x}))
    others = torch.rand(10000, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    assert not any(_carries_training_images(v) for v in (others, others.clamp(0.2, 0.8), torch.zeros(3, 16), x[:, :, 1:].flatten(1)))


def test_the_evaluation_hands_the_training_images_to_no_function_of_the_attacks():
    """The rule "attacks never read the training set", as calls: an audit of each threat model (weights only, the known
    start, the owner's exact recipe) hands its training images to no function of ``exhume/attacks/``. The checks that
    read them live in ``exhume/evaluation/`` and run the equations of ``exhume/equations/`` there, as the attacks do on
    their own view and candidates."""
    model, start, x = fine_tuned()
    train = (_marked(x), torch.tensor([1, 0, 1, 0]))
    unseen = torch.rand(12, 1, 4, 4, generator=torch.Generator().manual_seed(3))
    recipe = {"optimizer": "sgd", "lr": 0.1, "weight_decay": 1e-3, "batch_size": 4, "epochs": 50, "sampler": "sequential"}
    common = {"loss": "logistic", "normalize": (0.5, 1.0), "max_seconds": 300, "progress": False}
    cases = [{"weight_decay": 0.0, "attack_args": {"restarts": 1, "iterations": 3}},
             {"weight_decay": 1e-3, "start": start, "attack_args": {"restarts": 1, "iterations": 3}},
             {"weight_decay": 1e-3, "start": start, "training": recipe, "method": "simulate",
              "attack_args": {"iterations": 2}}]
    calls = _Calls()
    sys.setprofile(calls)
    try:
        results = [exhume.audit(model, train, unseen, **common, **case) for case in cases]
    finally:
        sys.setprofile(None)
    definitions = [r.metrics["victim"]["stationarity_definition"] for r in results]
    assert "λ ≥ 0" in definitions[0] and "θ_T − c·θ_0" in definitions[1] and "Run(θ_0; training data)" in definitions[2]
    assert calls.ran  # the attacks ran under the profile
    assert calls.offenders() == []

# -- the audit's one configuration ---------------------------------------------------------------------------

TOML = '''model = "model.py:Net"
weights = "net.safetensors"
train = "train.npz"
unseen = "unseen.npz"
normalize = "0.3,0.4"
loss = "bce"
weight_decay = 5e-3
max_seconds = 20
seed = 3
alpha = 0.01
[attack_args]
iterations = 200
'''


def test_the_audit_config_is_the_same_from_toml_flags_and_python(tmp_path):
    (tmp_path / "audit.toml").write_text(TOML)
    parser = build_parser()
    from_toml = from_command(parser.parse_args(["audit", "--config", str(tmp_path / "audit.toml")]), str(tmp_path / "audit.toml"))
    flags = ["audit", "--model", str(tmp_path / "model.py:Net"), "--weights", str(tmp_path / "net.safetensors"),
             "--train", str(tmp_path / "train.npz"), "--unseen", str(tmp_path / "unseen.npz"), "--normalize", "0.3,0.4",
             "--loss", "bce", "--weight-decay", "5e-3", "--max-seconds", "20", "--seed", "3", "--alpha", "0.01", "-p", "iterations=200"]
    from_flags = from_command(parser.parse_args(flags))
    assert from_toml == from_flags  # relative paths in the file are the file's folder's
    assert from_toml.loss == "logistic" and from_toml.weight_decay == 5e-3 and from_toml.attack_args == {"iterations": 200}
    python = from_options(loss="bce", weight_decay=0.005, normalize="0.3,0.4", max_seconds=20, seed=3, alpha=0.01,
                          attack_args={"iterations": 200}, out=from_toml.out)
    assert python == dataclasses.replace(from_toml, **{k: None for k in FILE_SETTINGS})
    assert python.mean_std() == ([0.3], [0.4]) and from_options(loss="ce", weight_decay=0, normalize=(0.3, 0.4)).mean_std() == ([0.3], [0.4])
    # a flag given on the command line wins over the file; -p adds to the file's attack_args
    over = from_command(parser.parse_args(["audit", "--config", str(tmp_path / "audit.toml"), "--seed", "7", "-p", "lr=0.1"]),
                        str(tmp_path / "audit.toml"))
    assert over.seed == 7 and over.attack_args == {"iterations": 200, "lr": 0.1}
    assert set(SETTINGS) == {f.name for f in dataclasses.fields(AuditConfig)}


@pytest.mark.parametrize("key, toml_value, flag_value, message", [
    ("weight_decay", "-1", "-1", "weight_decay: expected a number in"),
    ("alpha", "2.0", "2.0", "alpha"),
    ("max_seconds", "0", "0", "expected a number > 0, got 0.0"),
    ("loss", '"hinge"', "hinge", "unknown loss 'hinge'"),
    ("method", '"nope"', "nope", "unknown attack method 'nope'"),
    ("normalize", '"1,2,3"', "1,2,3", "--normalize '1,2,3': expected an even count"),
    ("device", '"tpu:9"', "tpu:9", "device 'tpu:9'"),
])
def test_a_bad_audit_setting_is_one_line_naming_it(tmp_path, capsys, key, toml_value, flag_value, message):
    base = {"model": '"m.py:Net"', "weights": '"w.safetensors"', "train": '"t.npz"', "unseen": '"u.npz"', "normalize": '"0.5,0.5"',
            "loss": '"logistic"', "weight_decay": "0"}
    toml = tmp_path / "audit.toml"
    toml.write_text("".join(f"{k} = {v}\n" for k, v in {**base, key: toml_value}.items()))
    assert main(["audit", "--config", str(toml)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    toml.write_text("".join(f"{k} = {v}\n" for k, v in base.items()))
    assert main(["audit", "--config", str(toml), f"--{key.replace('_', '-')}", flag_value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    python = {"normalize": (0.5, 0.5), "loss": "logistic", "weight_decay": 0, key: toml_value.strip('"')}
    if key in ("weight_decay", "alpha", "max_seconds"):
        python[key] = float(toml_value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.").split(":")[0]):
        exhume.audit(nn.Linear(4, 1), (torch.zeros(2, 1, 2, 2), [0, 1]), torch.zeros(4, 1, 2, 2), **python)


def test_an_unknown_audit_setting_names_it(tmp_path, capsys):
    toml = tmp_path / "audit.toml"
    toml.write_text('model = "m.py:Net"\nbatch = 3\n')
    assert main(["audit", "--config", str(toml)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key(s) batch" in err[0]
    with pytest.raises(ConfigError, match="audit\\(\\) has no setting batch"):
        from_options(batch=3)
    with pytest.raises(ConfigError, match="weights: a file setting of 'exhume audit'"):
        from_options(weights="w.safetensors", loss="logistic", weight_decay=0, normalize="none")
