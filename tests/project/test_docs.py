"""The docs stay true to the tree: bench/results/ is indexed, README.md and docs/ cite nothing outside the
repository, docs/architecture.md stays a map (<= 250 lines), its links resolve, and its layering rules hold."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OUTSIDE = re.compile(r"\.\./shared|shared/reference|shared/tools|DESIGN\.md|steering repo")

# docs/architecture.md, "Layering": a module imports only from its own floor or below
FLOORS = {"units": 1, "errors": 1, "progress": 1, "results": 1,
          "netlist": 2, "names": 2, "frontends": 2, "constraints": 2, "library": 2,
          "timing": 3, "runtime": 3,
          "passes": 4, "characterize": 4, "design": 4,
          "flow": 5, "emit": 5, "reports": 5, "outdir": 5,
          "cli": 6, "__main__": 6}


@pytest.mark.parametrize("folder", ["bench/results", "docs/decisions"])
def test_every_result_file_is_indexed(folder):
    results = ROOT / folder
    index = (results / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted(results.iterdir()) if p.name != "README.md" and f"`{p.name}`" not in index]
    assert not missing, f"{folder}/README.md does not index: {', '.join(missing)}"
    gone = [name for name in re.findall(r"^\| `([^`]+)` \|", index, re.M) if not (results / name).exists()]
    assert not gone, f"{folder}/README.md indexes files that are not there: {', '.join(gone)}"


def test_docs_cite_nothing_outside_the_repository():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in DOCS
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, "references outside the repository:\n" + "\n".join(hits)


def test_architecture_is_a_map():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    lines, words = text.splitlines(), len(text.split())
    assert len(lines) <= 250, f"docs/architecture.md has {len(lines)} lines; dated notes go to docs/decisions/"
    assert words <= 1500, f"docs/architecture.md has {words} words (at most 1500): dated findings go to docs/decisions/"


def test_links_resolve():
    link = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")
    broken = [f"{p.relative_to(ROOT)}: {target}" for p in DOCS for target in link.findall(p.read_text(encoding="utf-8"))
              if not (p.parent / target).exists()]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def _floor_of(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0] if rel[0] in ("passes", "reports") else Path(rel[1]).stem


def test_layering():
    sources = [p for top in ("softsyn", "passes", "reports") for p in sorted((ROOT / top).rglob("*.py"))
               if p.relative_to(ROOT).parts != ("softsyn", "__init__.py")]
    wrong = []
    for path in sources:
        floor = _floor_of(path)
        assert floor in FLOORS, f"{path.relative_to(ROOT)}: no floor for {floor!r} (docs/architecture.md, Layering)"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                parts = name.split(".")
                if parts[0] in ("passes", "reports"):
                    target = parts[0]
                elif parts[0] == "softsyn" and len(parts) >= 2:
                    target = parts[1]
                else:
                    continue
                assert target in FLOORS, f"{path.relative_to(ROOT)} imports {name}: no floor for {target!r}"
                if FLOORS[target] > FLOORS[floor]:
                    wrong.append(f"{path.relative_to(ROOT)} ({floor}, floor {FLOORS[floor]}) imports {name} "
                                 f"(floor {FLOORS[target]})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)
