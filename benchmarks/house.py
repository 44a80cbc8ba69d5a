"""Draw the package's rooms and the imports between them, at any revision (docs/DESIGN.md's "house" figures).

    python benchmarks/house.py --rev 2ad5c38 --out docs/figures/house-before.png
    python benchmarks/house.py --rev HEAD --out docs/figures/house-after.png

A room is a first-level subpackage of ``exhume/`` (``attacks/``) or a top-level module (``deadline.py``); an arrow
``A → B`` says some file of A imports from B (``import exhume.B``, ``from exhume.B import``, ``from exhume import B``
and relative imports, read with ``ast`` from ``git show REV:FILE``: nothing is run). Floors are the rooms' levels:
a room stands one floor above the highest room it uses, so every arrow points down; rooms that import each other
(a circle) share a floor and their arrows are drawn red. A box's width is its lines of code; it names its three
largest files. Prints the counts it draws.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from collections import defaultdict
from pathlib import Path

PACKAGE = "exhume"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def sources(rev: str) -> dict[str, str]:
    """``{path: text}`` of every ``.py`` file under the package at ``rev``."""
    paths = [p for p in _git("ls-tree", "-r", "--name-only", rev, PACKAGE).splitlines() if p.endswith(".py")]
    return {p: _git("show", f"{rev}:{p}") for p in paths}


def room_of(path: str) -> str | None:
    """``exhume/attacks/kkt/step.py`` → ``attacks/``; ``exhume/deadline.py`` → ``deadline.py``; the package's own
    ``__init__.py`` → None (the front door re-exports; it is not a room)."""
    parts = Path(path).parts[1:]
    if len(parts) == 1:
        return None if parts[0] == "__init__.py" else parts[0]
    return parts[0] + "/"


def _target(module: str, rooms: set[str]) -> str | None:
    """The room a dotted module name below the package falls in (None: outside it, or the package itself)."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    for name in (parts[1] + "/", parts[1] + ".py"):
        if name in rooms:
            return name
    return None


def imports(path: str, text: str, rooms: set[str]) -> set[str]:
    """The rooms ``path`` imports from."""
    package = ".".join(Path(path).with_suffix("").parts[:-1]) if not path.endswith("__init__.py") else ".".join(Path(path).parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(text, filename=path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{a.name}" for a in node.names)] if base == PACKAGE else [base]
        else:
            continue
        out.update(t for t in (_target(n, rooms) for n in names) if t is not None)
    return out


def house(rev: str) -> dict:
    """Rooms (lines, largest files), arrows, circles and floors of the package at ``rev``."""
    files = sources(rev)
    rooms: dict[str, dict] = defaultdict(lambda: {"lines": 0, "files": {}})
    for path, text in files.items():
        room = room_of(path)
        if room is not None:
            n = len(text.splitlines())
            rooms[room]["lines"] += n
            inner = Path(path).parts[2] if room.endswith("/") else room  # a file of the room, or a folder inside it
            key = inner if inner.endswith(".py") else inner + "/"
            rooms[room]["files"][key] = rooms[room]["files"].get(key, 0) + n
    names = set(rooms)
    arrows: set[tuple[str, str]] = set()
    for path, text in files.items():
        room = room_of(path)
        if room is not None:
            arrows.update((room, t) for t in imports(path, text, names) if t != room)
    # circles: rooms that reach each other; a room's floor is one above the highest floor it uses outside its circle
    reach = {r: {t for a, t in arrows if a == r} for r in names}
    changed = True
    while changed:
        changed = False
        for r in names:
            more = set().union(*(reach[t] for t in reach[r])) - reach[r] if reach[r] else set()
            if more:
                reach[r] |= more
                changed = True
    circle = {r: frozenset({r} | {t for t in reach[r] if r in reach[t]}) for r in names}
    floor: dict[str, int] = {}

    def level(r: str) -> int:
        if r not in floor:
            floor[r] = 0  # a guard while this circle's floor is found
            below = [t for a, t in arrows if a in circle[r] and t not in circle[r]]
            value = 1 + max((level(t) for t in below), default=-1)
            for c in circle[r]:
                floor[c] = value
        return floor[r]

    for r in sorted(names):
        level(r)
    circles = {c for c in circle.values() if len(c) > 1}
    return {"rev": rev, "rooms": dict(rooms), "arrows": arrows, "floors": floor, "circles": circles,
            "lines": sum(r["lines"] for r in rooms.values())}


def draw(h: dict, out: Path, title: str | None = None) -> None:
    """The house as a PNG: one row per floor (the ground at the bottom), box widths by lines, arrows downwards."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    floors: dict[int, list[str]] = defaultdict(list)
    for r, f in h["floors"].items():
        floors[f].append(r)
    top = max(floors) if floors else 0
    width, gap, box_h, floor_h, least = 100.0, 1.0, 5.0, 9.0, 600
    size = {r: max(room["lines"], least) for r, room in h["rooms"].items()}  # one scale for every floor
    scale = min((width - gap * (len(rs) - 1)) / sum(size[r] for r in rs) for rs in floors.values())
    place: dict[str, tuple[float, float, float]] = {}
    for f, rs in floors.items():
        rs.sort(key=lambda r: -h["rooms"][r]["lines"])
        x = (width - scale * sum(size[r] for r in rs) - gap * (len(rs) - 1)) / 2
        for r in rs:
            place[r] = (x, f * floor_h, scale * size[r])
            x += scale * size[r] + gap
    fig, ax = plt.subplots(figsize=(16, 1.6 + 1.15 * (top + 1)))
    in_circle = set().union(*h["circles"]) if h["circles"] else set()
    out_of: dict[str, list[str]] = defaultdict(list)
    into: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(h["arrows"], key=lambda ab: (place[ab[1]][0], place[ab[0]][0])):
        out_of[a].append(b)
        into[b].append(a)

    def spot(r: str, others: list[str], other: str) -> float:  # arrows spread along a box's edge, in the others' order
        x, _, w = place[r]
        return x + w * (others.index(other) + 1) / (len(others) + 1)

    for a, b in sorted(h["arrows"]):
        ya, yb = place[a][1], place[b][1]
        red = a in in_circle and b in in_circle and h["floors"][a] == h["floors"][b]
        ax.add_patch(FancyArrowPatch((spot(a, out_of[a], b), ya), (spot(b, into[b], a), yb + box_h), arrowstyle="-|>", mutation_scale=8,
                                     color="#c0392b" if red else "#9aa5b1", lw=0.6, alpha=0.9 if red else 0.45,
                                     connectionstyle="arc3,rad=0.05", zorder=1))
    for r, (x, y, w) in place.items():
        room = h["rooms"][r]
        ax.add_patch(Rectangle((x, y), w, box_h, facecolor="#dbe7f3" if r.endswith("/") else "#eef3f8",
                               edgecolor="#c0392b" if r in in_circle else "#4a6a8a", lw=1.0, zorder=2))
        wide = w > 14
        ax.text(x + 0.4, y + box_h - 0.6, r, fontsize=9 if wide else 7, weight="bold", va="top", zorder=3)
        ax.text(x + w - 0.4 if wide else x + 0.4, y + box_h - (0.6 if wide else 2.0), f"{room['lines']} lines",
                fontsize=7, ha="right" if wide else "left", va="top", color="#333", zorder=3)
        if wide and r.endswith("/"):
            big = sorted(room["files"].items(), key=lambda kv: -kv[1])[:3]
            ax.text(x + 0.4, y + 0.5, "\n".join(f"{k} {v}" for k, v in big), fontsize=6, va="bottom", color="#444", zorder=3)
    ax.set_xlim(-1, width + 1)
    ax.set_ylim(-1, top * floor_h + box_h + 1)
    ax.axis("off")
    ax.text(0, -1.5, f"drawn by python benchmarks/house.py --rev {h['rev']}: a box's width is its lines (at least {least}); a "
            "room stands one floor above the highest room it imports; a box lists its three largest files or folders",
            fontsize=7, color="#555", va="top")
    heading = title or f"exhume/ at {h['rev']}"
    ax.set_title(f"{heading}: {h['lines']:,} lines, {len(h['rooms'])} rooms on {top + 1} floors, {len(h['arrows'])} arrows, "
                 f"{len(h['circles'])} circles (red) — every arrow points down, the ground floor imports no room",
                 fontsize=10, loc="left")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="the git revision to draw (default HEAD)")
    ap.add_argument("--out", type=Path, help="write the drawing here (PNG); without it, only the counts are printed")
    ap.add_argument("--title", default=None, help="the drawing's heading (default: the revision)")
    args = ap.parse_args(argv)
    h = house(args.rev)
    print(f"{args.rev}: {h['lines']} lines, {len(h['rooms'])} rooms on {max(h['floors'].values()) + 1} floors, "
          f"{len(h['arrows'])} arrows, circles: {[sorted(c) for c in h['circles']] or 'none'}")
    for r in sorted(h["rooms"], key=lambda r: (-h["floors"][r], r)):
        print(f"  floor {h['floors'][r]:2d}  {r:18s} {h['rooms'][r]['lines']:6d} lines")
    if args.out is not None:
        draw(h, args.out, args.title)
        print(f"drawn to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
