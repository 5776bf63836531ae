"""The import graph of softsyn/, passes/ and reports/: no cycle anywhere (function-level imports included, and the
imports by name a lazy command table makes: a "package.module:name" string), and an import inside a function only
where it defers a heavy optional dependency, saying so (`# deferred: why`)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

from paths import ROOT

PACKAGES = ("softsyn", "passes", "reports")
REASON = "# deferred:"
LIMIT = 20  # function-level imports across softsyn/, passes/, reports/ (issue 24)
# a module named to be imported later (softsyn.cli.app's COMMANDS, a command spec's body): an edge like an import
BY_NAME = re.compile(r"((?:softsyn|passes|reports)(?:\.\w+)+):\w+")


def _modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` is, or lies in (an attribute of a module), or None (a third-party name)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The project modules an import statement runs: `from pkg import sub` the submodule, `from pkg import name`
    the package; relative imports resolved against `module`."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        subs = [f"{base}.{a.name}" for a in node.names]
        names = [s for s in subs if s in modules] + ([base] if any(s not in modules for s in subs) else [])
    return {t for t in (_resolve(n, modules) for n in names) if t and t != module}


def import_graph(root: Path = ROOT) -> tuple[nx.DiGraph, list[tuple[str, int, str]]]:
    """(module -> module edges, each with the line of its first import; the function-level imports as
    (file, line, the statement's first line with the line above it))."""
    modules = _modules(root)
    graph, in_functions = nx.DiGraph(), []
    for module, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        graph.add_node(module)
        nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            named = BY_NAME.fullmatch(node.value) if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                else None
            target = _resolve(named[1], modules) if named else None
            if target and target != module and not graph.has_edge(module, target):
                graph.add_edge(module, target, line=node.lineno)
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, module, path.name == "__init__.py", modules):
                if not graph.has_edge(module, target):
                    graph.add_edge(module, target, line=node.lineno)
            if id(node) in nested:
                above = lines[node.lineno - 2] if node.lineno > 1 else ""
                in_functions.append((str(path.relative_to(root)), node.lineno, above + "\n" + lines[node.lineno - 1]))
    return graph, in_functions


def test_no_import_cycles():
    graph, _ = import_graph()
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    shown = " -> ".join(f"{a} (line {graph.edges[a, b]['line']})" for a, b in cycle) + f" -> {cycle[0][0]}"
    raise AssertionError(f"import cycle: {shown}")


def test_function_level_imports_are_few_and_say_why():
    _, in_functions = import_graph()
    unexplained = [f"{file}:{line}" for file, line, text in in_functions if REASON not in text]
    assert not unexplained, (f"imports inside functions without a '{REASON} why' comment (move them to the module top, "
                             "or say which heavy optional dependency they defer):\n" + "\n".join(unexplained))
    counted = [f"{file}:{line}" for file, line, _ in in_functions]
    assert len(counted) <= LIMIT, (f"{len(counted)} imports inside functions (at most {LIMIT}): defer a heavy "
                                   "dependency once, where its side of the code is entered:\n" + "\n".join(counted))



def test_the_cycle_check_sees_function_level_imports(tmp_path):
    """A cycle closed only by an import inside a function is found (the check reads every import statement)."""
    for top in PACKAGES:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    (tmp_path / "passes" / "a.py").write_text("from passes.b import B\n")
    (tmp_path / "passes" / "b.py").write_text("B = 1\n\n\ndef f():\n    from passes.a import A\n    return A\n")
    graph, in_functions = import_graph(tmp_path)
    assert nx.find_cycle(graph) and [(f, line) for f, line, _ in in_functions] == [("passes/b.py", 5)]


def test_the_cycle_check_sees_imports_by_name(tmp_path):
    """A cycle closed only by a module named for a later import ("passes.a:A", a lazy command table's entry) is found,
    and such names are edges of the graph (softsyn.cli.app's table reaches the command specs)."""
    for top in PACKAGES:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    (tmp_path / "passes" / "a.py").write_text("from passes.b import B\n")
    (tmp_path / "passes" / "b.py").write_text('B = 1\nLATER = "passes.a:A"\n')
    graph, _ = import_graph(tmp_path)
    assert nx.find_cycle(graph)
    graph, _ = import_graph()
    assert graph.has_edge("softsyn.cli.app", "softsyn.cli.design") and graph.has_edge("softsyn.cli.design",
                                                                                       "softsyn.cli.design_run")
