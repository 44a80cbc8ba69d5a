"""Every setting declared once: no list of optimisers, precisions, losses, match rules or initialisations
spelled twice in exhume/, no second default attack, "auto or a number" validated by Param itself, restarts
parsed by one function, and the report reading the verdict the evaluation decides."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from exhume.attacks import ATTACKS, get_attack
from exhume.attacks.engine.base import DEFAULT_METHOD, Param
from exhume.errors import ConfigError

EXHUME = Path(__file__).resolve().parents[1] / "exhume"
FAMILIES = {
    "optimisers": {"gd", "sgd", "adam", "adamw"},
    "precisions": {"float16", "bfloat16", "float32", "float64"},
    "losses": {"logistic", "cross-entropy", "squared", "bce", "bce-with-logits", "binary-cross-entropy", "ce"},
    "match rules": {"ssim", "l2", "ncc"},
    "initialisations": {"noise", "ground-truth", "partition", "mix"},
}


def _string_lists(tree: ast.AST):
    """Tuples, lists and sets of two or more string constants, and the string keys of dict literals."""
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
        names = [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(names) >= 2 and len(names) == len(items):
            yield node.lineno, frozenset(names)


def test_no_list_of_names_appears_twice_in_exhume():
    found = defaultdict(list)  # family -> [(module, line, names)]
    for path in sorted(EXHUME.rglob("*.py")):
        for line, names in _string_lists(ast.parse(path.read_text())):
            for family, vocabulary in FAMILIES.items():
                if names <= vocabulary:
                    found[family].append((str(path.relative_to(EXHUME)), line, names))
    assert set(found) == set(FAMILIES), "a family's declaration was not found: the check no longer sees it"
    for family, where in found.items():
        modules = {m for m, _, _ in where}
        assert len(modules) == 1, f"{family} are spelled in {len(modules)} modules, declare them once and import: {where}"
        sets = [names for _, _, names in where]
        assert len(sets) == len(set(sets)), f"a list of {family} appears twice: {where}"


def test_the_default_attack_is_named_once():
    """Outside attacks/, "kkt" appears only where kkt is run by name (the demo, the KKT papers' experiments, the law
    experiment, which measures kkt's two multiplier modes)."""
    named = []
    for path in sorted(EXHUME.rglob("*.py")):
        rel = path.relative_to(EXHUME)
        if rel.parts[0] == "attacks":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in (DEFAULT_METHOD, f"exhume-{DEFAULT_METHOD}"):
                named.append(str(rel))
    assert set(named) <= {"demo.py", "experiments/kkt_study.py", "experiments/law.py"}, named


def test_param_takes_auto_or_a_number_and_says_so():
    p = Param("auto", float, "S", low=0.0, low_open=True, words=("auto",))
    assert p.validate("s", "auto") == "auto" and p.validate("s", 2) == 2.0 and isinstance(p.validate("s", 2), float)
    for bad in (0, -1.0, "fast", True, float("nan"), float("inf"), [1]):
        with pytest.raises(ConfigError, match=r"^s must be 'auto' or a number > 0, got "):
            p.validate("s", bad)
    decay = Param("auto", float, "c", low=0.0, low_open=True, high=2.0, words=("auto", "fit"))
    assert decay.validate("c", "fit") == "fit" and decay.validate("c", 2) == 2.0
    with pytest.raises(ConfigError, match=r"^c must be 'auto', 'fit' or a number in \(0, 2\], got 2.5"):
        decay.validate("c", 2.5)
    assert decay.range_text() == "auto | fit | (0.0, 2.0]"
    ranged = Param(0.5, float, "x", low=0.0, high=1.0)
    assert ranged.range_text() == "[0.0, 1.0]" and ranged.allowed() == "a number in [0, 1]"


@pytest.mark.parametrize("method, name, bad, expected", [
    ("kkt", "lambda_scale", 0, "'auto' or a number > 0"),
    ("kkt", "lr_lambda", -1e-3, "'auto' or a number >= 0"),
    ("kkt", "background", 0.6, "'auto' or a number in [0, 0.5]"),
    ("kkt", "start_decay", "sometimes", "'auto', 'fit' or a number in (0, 2]"),
    ("simulate", "background", "dark", "'auto' or a number in [0, 0.5]"),
])
def test_the_attacks_words_or_numbers_are_validated_by_param(method, name, bad, expected):
    with pytest.raises(ConfigError, match=f"^{name} must be " + expected.replace("(", r"\(").replace("[", r"\[")):
        get_attack(method, **{name: bad})
    atk = get_attack(method, **{name: ATTACKS[method].params[name].words[0]})
    assert atk.config[name] == ATTACKS[method].params[name].words[0]


def test_no_attack_parameter_is_typed_object():
    untyped = [(m, n) for m, cls in ATTACKS.items() for n, p in cls.params.items() if p.kind is object]
    assert untyped == []


def test_restarts_are_parsed_by_one_function(capsys):
    from exhume.cli import main
    from exhume.params import parse_restarts
    from exhume.portfolio.plan import resolve_restarts

    assert parse_restarts("3") == 3 and parse_restarts(4) == 4 and parse_restarts("auto") == "auto" and parse_restarts(None) is None
    for bad in ("0", "x", "-2", 0, True, 2.5):
        with pytest.raises(ConfigError, match=r"^restarts expects a positive integer or 'auto'"):
            parse_restarts(bad)
    assert resolve_restarts("5", None, 1, 10.0) == 5
    with pytest.raises(ConfigError, match=r"^restarts expects"):
        resolve_restarts("none", None, 1, 10.0)
    assert main(["attack", "nowhere", "-o", "nowhere", "--restarts", "zero"]) == 2
    assert "--restarts expects a positive integer or 'auto', got 'zero'" in capsys.readouterr().err


def test_the_report_words_the_verdict_the_evaluation_decides():
    """A metrics.json from before the verdict was stored: the report asks evaluation/verdict.py, not a rule of its own."""
    from exhume.evaluation.verdict import decide
    from exhume.report.html import verdict

    for k, c in ((12, 0), (1, 1), (0, 0), (6, 2)):
        m = {"n_train": 20, "memorised": k, "pool_size": 200, "memorised_control": c, "control_size": 20, "ssim>=0.4": k,
             "pool_ssim>=0.4": 0}
        text, leaks = verdict(m)
        assert leaks == (decide(m).verdict == "leaks"), (k, c)
        assert f"p = {decide(m).p_value:.2g}" in text
