"""The docs stay true: every code block in README.md and docs/*.md runs (or says why not), every
relative link and #anchor resolves, and module docstrings keep to the contract.

How a page's fenced blocks are treated (docs/DESIGN.md, "Docs that stay true"):

- ``bash`` and ``python`` blocks run, in the page's order, in one working folder per page that
  starts with a tiny victim at ``runs/victim`` (trained once per session). ``exhume ...`` lines
  run in this process through ``exhume.cli.main`` and must exit 0; ``python FILE`` runs a file
  the page wrote; Python blocks of one page share one namespace. A page's own
  ``exhume train -o runs/victim`` replaces the starting victim (``train`` refuses to overwrite one).
- HTML comments on the lines just before a block change that:
  ``<!-- not run: REASON -->`` skips it; ``<!-- parse only: REASON -->`` checks each command
  without running it (exhume's own argparse parser and each ``-p`` name against the attack's
  parameters; ``make`` targets in the Makefile; ``pip install 'exhume[extra]'`` extras in
  pyproject.toml; ``python FILE`` exists); ``<!-- file: NAME -->`` writes the block to NAME;
  ``<!-- sub: OLD => NEW -->`` (any number) replaces text before the block runs, for sizes.
  ``<!-- needs: MODULE -->`` (a module of an optional extra, e.g. optuna): without it the block is
  left out and, once the page's other blocks ran, the test skips with the reason (fails under CI).
  ``python -c CODE`` runs CODE; its exit status (a CI gate's verdict) is not checked.
- Budgets are cut everywhere without a marker: ``--max-seconds N`` and ``max_seconds=N`` become 2,
  ``--trial-seconds N`` becomes 2.
- Any other fenced block must name a language that is not code (``text``, ``toml`` with a file
  marker ...): an unlabelled fence fails.
"""

from __future__ import annotations

import ast
import importlib
import re
import runpy
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _extras import missing

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
NOT_CODE = {"text", "toml", "json", "console-output"}
BUDGETS = [(r"--max-seconds \d+(\.\d+)?", "--max-seconds 2"), (r"max_seconds=\d+(\.\d+)?", "max_seconds=2"),
           (r"--trial-seconds \d+(\.\d+)?", "--trial-seconds 2")]
MARKER = re.compile(r"<!--\s*(not run|parse only|file|sub|needs):\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\S*)\s*$")
SEEDED = ".seeded-by-the-doc-test"  # marks the page's starting victim, which a page's own 'exhume train -o runs/victim' replaces


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mode: str = "run"  # run | parse only | not run | file
    reason: str = ""
    file: str = ""
    subs: list[tuple[str, str]] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)  # modules of an optional extra the block imports

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, with the markers on the lines just before each."""
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        b = Block(page, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n")
        k = start - 1
        while k >= 0 and (mk := MARKER.fullmatch(lines[k].strip())):
            kind, text = mk.groups()
            if kind == "sub":
                old, sep, new = text.partition(" => ")
                assert sep, f"{b.where()}: a sub marker reads <!-- sub: OLD => NEW -->"
                b.subs.append((old, new))
            elif kind == "file":
                b.mode, b.file = "file", text
            elif kind == "needs":
                b.needs.append(text)
            else:
                b.mode, b.reason = kind, text
            k -= 1
        out.append(b)
        i = j + 1
    return out


def commands(code: str) -> list[str]:
    """Shell commands of a bash block: continuation lines joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [c for c in (shlex.join(shlex.split(line, comments=True)) for line in joined.splitlines()) if c]


def prepared(b: Block) -> str:
    code = b.code
    for old, new in b.subs:
        assert old in code, f"{b.where()}: the sub marker's text {old!r} is not in the block"
        code = code.replace(old, new)
    for pattern, new in BUDGETS:
        code = re.sub(pattern, new, code)
    return code


# ---------------------------------------------------------------- checking a command by its parser


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))


def _extras() -> set[str]:
    """The names of pyproject.toml's optional-dependencies (read by hand: tomllib is Python >= 3.11)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, flags=re.M))


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _extras_of(modules: list[str]) -> str:
    """``pip install 'exhume[X]'`` for the extras of pyproject.toml that list these modules."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    names = [e for e, reqs in re.findall(r"^([\w-]+)\s*=\s*\[(.*?)\]", section, flags=re.M)
             if all(re.search(rf'"{m}\b', reqs) for m in modules)]
    return " or ".join(f"pip install 'exhume[{e}]'" for e in names) or "no extra lists it"


def parse_command(cmd: str, where: str, folder: Path) -> None:
    argv = shlex.split(cmd)
    if argv[0] == "exhume":
        from exhume.attacks import ATTACKS
        from exhume.cli import build_parser

        try:
            args = build_parser().parse_args(argv[1:])
        except SystemExit as e:  # argparse refused it
            pytest.fail(f"{where}: exhume's parser refuses {cmd!r} (exit {e.code})")
        method = getattr(args, "method", None) or "kkt"
        assert method in ATTACKS, f"{where}: unknown attack {method!r} in {cmd!r}"
        for kv in getattr(args, "param", None) or []:
            name = kv.partition("=")[0]
            assert name in ATTACKS[method].params, f"{where}: {method} has no parameter {name!r} ({cmd!r})"
    elif argv[0] == "make":
        assert set(argv[1:]) <= _makefile_targets(), f"{where}: the Makefile lacks a target of {cmd!r}"
    elif argv[:2] == ["pip", "install"]:
        for spec in argv[2:]:
            extra = re.fullmatch(r"exhume\[([\w,-]+)\]", spec)
            assert extra and set(extra.group(1).split(",")) <= _extras(), f"{where}: no such extra in {cmd!r}"
    elif argv[:2] == ["python", "-c"]:
        compile(argv[2], where, "exec")
    elif argv[0] == "python":
        assert (ROOT / argv[1]).exists() or (folder / argv[1]).exists(), f"{where}: {argv[1]} does not exist"
    else:
        pytest.fail(f"{where}: the doc test cannot check {cmd!r}; mark the block <!-- not run: REASON -->")


# ---------------------------------------------------------------- running a page


def _out(argv: list[str]) -> str | None:
    for flag in ("-o", "--out"):
        if flag in argv[:-1]:
            return argv[argv.index(flag) + 1]
    return None


def run_bash(b: Block, code: str, folder: Path) -> None:
    from exhume.cli import main

    for cmd in commands(code):
        argv = shlex.split(cmd)
        if argv[0] == "exhume":
            if argv[1] == "train" and (folder / "runs" / "victim" / SEEDED).exists() and _out(argv) == "runs/victim":
                shutil.rmtree(folder / "runs" / "victim")  # the page trains its own victim where the seeded one was
            assert main(argv[1:]) == 0, f"{b.where()}: {cmd!r} failed (see the captured output)"
        elif argv[:2] == ["python", "-c"]:
            try:
                exec(compile(argv[2], b.where(), "exec"), {"__name__": "__main__"})
            except SystemExit:  # a CI gate's exit status is its verdict, not a failure of the docs
                pass
        elif argv[0] == "python":
            old = sys.argv
            sys.argv = argv[1:]
            try:
                runpy.run_path(str(folder / argv[1]), run_name="__main__")
            finally:
                sys.argv = old
        else:
            pytest.fail(f"{b.where()}: the doc test runs only exhume and python commands; mark {cmd!r} parse only or not run")


@pytest.fixture(scope="session")
def tiny_victim(tmp_path_factory) -> Path:
    from exhume.cli import main

    folder = tmp_path_factory.mktemp("docs-victim") / "victim"
    assert main(["train", "--data", "mnist", "-n", "10", "--arch", "mlp:256,256;bias=none;init=1e-4", "--wd", "5e-3",
                 "--epochs", "300", "-o", str(folder), "--no-progress"]) == 0
    return folder


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page, tiny_victim, tmp_path, monkeypatch):
    shutil.copytree(tiny_victim, tmp_path / "runs" / "victim")
    (tmp_path / "runs" / "victim" / SEEDED).touch()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    namespace: dict = {"__name__": "__main__"}
    left_out = []
    try:
        for b in blocks(page):
            lang = CODE.get(b.lang)
            absent = [m for m in b.needs if not _importable(m)]
            if absent:
                left_out.append(f"{b.where()} needs {', '.join(absent)} ({_extras_of(absent)})")
            elif b.mode == "file":
                (tmp_path / b.file).write_text(prepared(b))
            elif lang is None:
                assert b.lang in NOT_CODE, f"{b.where()}: a fenced block needs a language ({sorted(CODE)} or {sorted(NOT_CODE)})"
            elif b.mode == "not run":
                assert b.reason, f"{b.where()}: say why the block is not run"
            elif b.mode == "parse only":
                assert b.reason and lang == "bash", f"{b.where()}: parse only is for bash blocks, with a reason"
                for cmd in commands(prepared(b)):
                    parse_command(cmd, b.where(), tmp_path)
            elif lang == "bash":
                run_bash(b, prepared(b), tmp_path)
            else:
                exec(compile(prepared(b), b.where(), "exec"), namespace)
    finally:
        for name in set(sys.modules) - before:  # modules a page wrote (mymodel) must not leak into the next page
            if getattr(sys.modules[name], "__file__", None) and str(tmp_path) in str(sys.modules[name].__file__):
                del sys.modules[name]
    if left_out:
        missing("; ".join(left_out) + ", not installed: left out, the page's other blocks ran")


# ---------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        m = re.match(r"#{1,6} (.*)", line)
        if m and not in_fence:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


LINK = re.compile(r"(?<!\\)\]\(([^)\s]+)\)")


def test_slug_follows_github():
    assert slug("4. How a reconstruction is judged") == "4-how-a-reconstruction-is-judged"
    assert slug("`bench_iteration.py`: milliseconds per attack iteration") == "bench_iterationpy-milliseconds-per-attack-iteration"
    assert slug("The λ scale (this machine, 2026-11-23)") == "the-λ-scale-this-machine-2026-11-23"


#: pages whose links are checked but whose code blocks are not run: the results page, its dated notes, research/
LINKED = [ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks" / "notes").glob("*.md")), ROOT / "research" / "README.md"]


@pytest.mark.parametrize("page", [*PAGES, *LINKED], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.relative_to(ROOT)}: link to {target} points to nothing"
        if anchor:
            assert dest.suffix == ".md", f"{page.relative_to(ROOT)}: #anchor on a file that is not markdown: {target}"
            assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: {dest.name} has no heading #{anchor}"


# ---------------------------------------------------------------- docstrings and labels


#: modules that still cite the results log (benchmarks/README.md or its notes) while another change rewrites them;
#: the test fails when a module leaves this set (take it out) or another cites the log (cite docs/ instead)
def test_the_code_cites_docs_not_the_results_log():
    """Code and help texts cite a default's evidence as ``docs/defaults.md#anchor`` (a stable heading), each anchor from
    one place; never the dated results log, whose pages are history."""
    known = anchors(ROOT / "docs" / "defaults.md")
    cited: dict[str, list[str]] = {}
    log = set()
    for path in sorted((ROOT / "exhume").rglob("*.py")):
        text, name = path.read_text(), str(path.relative_to(ROOT))
        for anchor in re.findall(r"docs/defaults\.md#([\w-]+)", text):
            cited.setdefault(anchor, []).append(name)
        if re.search(r"benchmarks/(README\.md|notes/)", text):
            log.add(name)
    assert cited, "no anchor cited: the pattern no longer matches the code's citations"
    assert sorted(set(cited) - known) == [], "anchors cited in exhume/ but not headings of docs/defaults.md"
    assert {a: w for a, w in cited.items() if len(w) > 1} == {}, "an anchor cited from more than one place"
    assert sorted(log) == [], "cite docs/defaults.md (or another docs/ page), not the results log"


def test_no_test_puts_benchmarks_on_sys_path():
    """Tests import the maintained benchmarks as the package ``exhume_benchmarks`` from the repository root (pytest's
    pythonpath), never by putting one of its folders on sys.path; research/ is not imported by the suite."""
    # test_benchmarks_package.py puts the root last on a child process's sys.path: the order the package must survive
    hits = [f"{p.name}:{n}" for p in sorted((ROOT / "tests").glob("*.py")) if p.name not in ("test_docs.py", "test_benchmarks_package.py")
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if "sys.path" in line and ("benchmarks" in line or "research" in line)
            or re.match(r"\s*(from|import) research\b", line)]
    assert not hits, "import exhume_benchmarks.<module> instead: " + ", ".join(hits)


def test_module_docstrings_are_at_most_30_lines():
    long = []
    for path in sorted((ROOT / "exhume").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc is not None and len(doc.splitlines()) > 30:
            long.append(f"{path.relative_to(ROOT)}: {len(doc.splitlines())} lines")
    assert not long, "module docstrings keep the contract, one line of why and a pointer (at most 30 lines): " + "; ".join(long)


def test_no_function_in_exhume_is_over_60_lines():
    """The front door's rule (docs/DESIGN.md, "Principles"): a function longer than 60 lines, decorators included, is
    split by responsibility."""
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1} lines"
            for path in sorted((ROOT / "exhume").rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1 > 60]
    assert not long, long


def test_no_internal_labels_in_docs_or_code():
    label = re.compile(r"issue [0-9]+|paper 00[0-9]")
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "exhume").rglob("*.py")]
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in files for n, line in enumerate(p.read_text().splitlines(), 1) if label.search(line)]
    assert not hits, "name papers by author and year, not by internal numbers: " + ", ".join(hits)
