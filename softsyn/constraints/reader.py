"""YAML with line numbers: read a composed node tree, naming ``file:line: key:`` in every error.

One reader serves every softsyn input file (constraints, libraries). The text is composed with the
safe loader (``yaml.compose(text, Loader=yaml.SafeLoader)``) and read node by node, so an error can
point at the line of the key or value it is about. Keys are named by their dotted path
(``path_groups.decode.clock_period``, ``cells.0.axes``); ``key_lines`` maps each path the reader has
seen to its 1-based line, and an error about a key that has no line of its own (a missing key) points
at its nearest parent's.

Two ways to use it:

* validate node by node (`mapping`, `time`, `size`, `integer`, ... record the keys they read and raise
  on the first problem): the constraints loader;
* `index` the whole tree, validate the plain data (`data`) and raise `at(key, message)`: the library
  loader.
"""
from __future__ import annotations

import difflib
from typing import Any

from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from softsyn.errors import SoftsynError
from softsyn.units import UnitError, parse_bytes, parse_percent, parse_time

__all__ = ["YamlReader", "describe", "line_of", "error_at"]


def describe(node: Node) -> str:
    """What a node holds, for messages: "a mapping", "an integer (3)", "a string ('x')"."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    tag = node.tag.rsplit(":", 1)[-1]
    return {
        "null": "nothing",
        "bool": f"a boolean ({node.value})",
        "int": f"an integer ({node.value})",
        "float": f"a number ({node.value})",
        "str": f"a string ({node.value!r})",
    }.get(tag, f"{tag} ({node.value!r})")


def line_of(key_lines: dict[str, int], key: str) -> int | None:
    """1-based line of a dotted key path, or of its nearest parent that has one; None if none has."""
    while key:
        if key in key_lines:
            return key_lines[key]
        key = key.rpartition(".")[0]
    return None


def error_at(source: str, key_lines: dict[str, int], key: str, message: str,
             error: type[SoftsynError] = SoftsynError) -> SoftsynError:
    """``file:line: key: message`` with the line of ``key`` (see line_of), or ``file: key: message``."""
    line = line_of(key_lines, key)
    where = f"{source}:{line}" if line is not None else source
    return error(f"{where}: {key}: {message}")


class YamlReader:
    """Reads the nodes of one YAML file named ``source``; errors are ``error`` instances, one line each.

    ``synonyms`` maps words people write for a key to the key, only to suggest it in unknown-key errors.
    """

    def __init__(self, source: str, error: type[SoftsynError] = SoftsynError, synonyms: dict[str, str] | None = None):
        self.source = source
        self.error = error
        self.synonyms = dict(synonyms or {})
        self.constructor = SafeConstructor()
        self.key_lines: dict[str, int] = {}
        self.raw: dict[str, str] = {}  # dotted key -> time as written, for messages

    # -- errors ------------------------------------------------------------------

    def fail(self, node: Node, key: str, message: str) -> SoftsynError:
        """An error at ``node``'s line: ``file:line: key: message``."""
        line = node.start_mark.line + 1
        prefix = f"{key}: " if key else ""
        return self.error(f"{self.source}:{line}: {prefix}{message}")

    def at(self, key: str, message: str) -> SoftsynError:
        """An error at ``key``'s line, or its nearest parent's (for checks made on the plain data)."""
        return error_at(self.source, self.key_lines, key, message, self.error)

    # -- whole documents -----------------------------------------------------------

    def index(self, root: Node | None) -> None:
        """Record the line of every key path in the tree: mapping keys by name, list items by index."""

        def walk(node, prefix: str) -> None:
            if isinstance(node, MappingNode):
                for k, v in node.value:
                    key = f"{prefix}{k.value}"
                    self.key_lines[key] = k.start_mark.line + 1
                    walk(v, key + ".")
            elif isinstance(node, SequenceNode):
                for i, v in enumerate(node.value):
                    key = f"{prefix}{i}"
                    self.key_lines[key] = v.start_mark.line + 1
                    walk(v, key + ".")

        walk(root, "")

    def data(self, root: Node | None) -> Any:
        """The plain Python data of a whole document, as ``yaml.safe_load`` gives it."""
        return None if root is None else self.constructor.construct_document(root)

    # -- nodes ---------------------------------------------------------------------

    def value(self, node: Node) -> Any:
        return self.constructor.construct_object(node, deep=True)

    def is_null(self, node: Node) -> bool:
        return isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"

    def mapping(self, node: Node, key: str, valid: tuple[str, ...] | None = None,
                what: str | None = None) -> dict[str, tuple[Node, Node]]:
        """Entries of a mapping node: name -> (key node, value node). Checks duplicates and,
        with ``valid``, unknown keys (with a suggestion)."""
        if self.is_null(node):
            return {}
        if not isinstance(node, MappingNode):
            expected = what or "a mapping"
            if valid is not None:
                expected += " with keys " + ", ".join(valid)
            if key:
                raise self.fail(node, key, f"expected {expected}, got {describe(node)}")
            raise self.fail(node, "", f"the top level must be {expected}, got {describe(node)}")
        self.constructor.flatten_mapping(node)  # YAML merge keys (<<: *anchor)
        out: dict[str, tuple[Node, Node]] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, ScalarNode):
                raise self.fail(knode, key, f"keys must be plain names, got {describe(knode)}")
            name = knode.value
            if valid is not None and name not in valid:
                raise self.fail(knode, key, self.unknown(name, valid))
            if name in out:
                first = out[name][0].start_mark.line + 1
                raise self.fail(knode, key, f"duplicate key {name!r} (first given on line {first})")
            out[name] = (knode, vnode)
            self.key_lines[f"{key}.{name}" if key else name] = knode.start_mark.line + 1
        return out

    def unknown(self, name: str, valid: tuple[str, ...]) -> str:
        norm = name.strip().lower().replace("-", "_").replace(" ", "_")
        guess = norm if norm in valid else self.synonyms.get(norm)
        if guess not in valid:
            close = difflib.get_close_matches(norm, valid, n=1, cutoff=0.6)
            guess = close[0] if close else None
        hint = f"did you mean {guess!r}? " if guess else ""
        return f"unknown key {name!r}; {hint}valid keys: {', '.join(valid)}"

    def scalar(self, node: Node, key: str, expected: str) -> Any:
        if isinstance(node, (MappingNode, SequenceNode)):
            raise self.fail(node, key, f"expected {expected}, got {describe(node)}")
        if self.is_null(node):
            raise self.fail(node, key, f"no value given; expected {expected}")
        return self.value(node)

    def time(self, node: Node, key: str, *, positive: bool = False) -> float:
        raw = self.scalar(node, key, "a time with a unit, e.g. 600ms")
        self.raw[key] = str(raw)
        try:
            t = parse_time(raw)
        except UnitError as e:
            raise self.fail(node, key, str(e)) from None
        if positive and t <= 0:
            raise self.fail(node, key, f"must be a positive time, got {raw!r}")
        if not positive and t < 0:
            raise self.fail(node, key, f"must not be negative, got {raw!r}")
        return t

    def size(self, node: Node, key: str) -> int:
        raw = self.scalar(node, key, "a size with a unit, e.g. 80GB or 80GiB")
        try:
            b = parse_bytes(raw)
        except UnitError as e:
            raise self.fail(node, key, str(e)) from None
        if b <= 0:
            raise self.fail(node, key, f"must be a positive size, got {raw!r}")
        return b

    def fraction(self, node: Node, key: str, *, at_most_one: bool = False) -> float:
        raw = self.scalar(node, key, "a percentage like '1%' or a fraction 0..1")
        try:
            f = parse_percent(raw)
        except UnitError as e:
            raise self.fail(node, key, str(e)) from None
        if f < 0 or (at_most_one and f > 1):
            rng = "0%..100%" if at_most_one else "0% or more"
            raise self.fail(node, key, f"must be within {rng}, got {raw!r}")
        return f

    def integer(self, node: Node, key: str, minimum: int) -> int:
        raw = self.scalar(node, key, f"an integer >= {minimum}")
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise self.fail(node, key, f"expected an integer >= {minimum}, got {describe(node)}")
        if raw < minimum:
            raise self.fail(node, key, f"must be an integer >= {minimum}, got {raw}")
        return raw

    def number(self, node: Node, key: str, minimum: float) -> float:
        raw = self.scalar(node, key, f"a number >= {minimum:g}")
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise self.fail(node, key, f"expected a number >= {minimum:g}, got {describe(node)}")
        if not raw >= minimum or raw == float("inf"):
            raise self.fail(node, key, f"must be a finite number >= {minimum:g}, got {raw}")
        return float(raw)

    def string(self, node: Node, key: str, expected: str = "a string") -> str:
        raw = self.scalar(node, key, expected)
        if not isinstance(raw, str) or not raw.strip():
            raise self.fail(node, key, f"expected {expected}, got {describe(node)}")
        return raw.strip()

    def choice(self, node: Node, key: str, valid: tuple[str, ...], what: str) -> str:
        raw = self.scalar(node, key, f"one of {', '.join(valid)}")
        name = str(raw).strip().lower() if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else None
        if name not in valid:
            close = difflib.get_close_matches(name or "", valid, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise self.fail(node, key, f"unknown {what} {raw!r}; {hint}valid: {', '.join(valid)}")
        return name

    def string_list(self, node: Node, key: str, expected: str) -> list[str]:
        """A list of strings; a single string is taken as a one-item list."""
        if isinstance(node, ScalarNode) and not self.is_null(node):
            return [self.string(node, key, expected)]
        if not isinstance(node, SequenceNode):
            raise self.fail(node, key, f"expected a list of {expected}, got {describe(node)}")
        return [self.string(item, f"{key}[{i}]", expected) for i, item in enumerate(node.value)]
