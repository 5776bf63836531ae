"""The code stays readable (docs/architecture.md house rules): no function in softsyn/, passes/ or reports/ runs over
100 lines, and no call there passes more than 6 positional arguments (name them, or pass a settings object)."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

from paths import ROOT

PACKAGES = ("softsyn", "passes", "reports")
MAX_FUNCTION_LINES = 100
MAX_POSITIONAL = 6
# Wide calls left in files other engineers were rewriting at the same time (issue 24): the sliding-window / no-KV
# attention work (passes/fuse/attention.py) and the compile loop's package move (passes/optimize). (path pattern,
# callee) each; an entry that no longer offends fails its own test, so the list only shrinks.
def _sources() -> list[Path]:
    return [p for top in PACKAGES for p in sorted((ROOT / top).rglob("*.py"))]


@functools.cache
def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def long_functions(path: Path) -> list[str]:
    """'file:line name (N lines)' for each function (def line to last line, nested ones counted in their parent)
    over MAX_FUNCTION_LINES."""
    rel = _name(path)
    return [f"{rel}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(_tree(path))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def wide_calls(path: Path) -> list[str]:
    """'file:line callee (N positional)' for each call passing more than MAX_POSITIONAL positional arguments."""
    rel = _name(path)
    return [f"{rel}:{node.lineno} {ast.unparse(node.func)} ({len(node.args)} positional)"
            for node in ast.walk(_tree(path))
            if isinstance(node, ast.Call) and len(node.args) > MAX_POSITIONAL]


def test_checker_sees_offenders(tmp_path):
    # the checks themselves can fail: a 101-line function and a 7-argument call are reported with file:line
    src = tmp_path / "probe.py"
    src.write_text("\n".join(["def f(*a):"] + ["    x = 1"] * 100 + ["g(1, 2, 3, 4, 5, 6, 7)", "g(1, 2, 3, 4, 5, 6)"]),
                   encoding="utf-8")
    assert long_functions(src) == ["probe.py:1 f (101 lines)"]
    assert wide_calls(src) == ["probe.py:102 g (7 positional)"]


def test_no_function_over_100_lines():
    offenders = [o for p in _sources() for o in long_functions(p)]
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def test_no_call_with_more_than_6_positional_arguments():
    offenders = [o for p in _sources() for o in wide_calls(p)]
    assert not offenders, f"calls with more than {MAX_POSITIONAL} positional arguments:\n" + "\n".join(offenders)
