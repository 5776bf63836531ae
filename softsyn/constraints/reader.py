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

`compose` is how both read the text. It answers in one line (``file:line: ...``) for what PyYAML would
answer with a traceback, a RecursionError or a hang:

* syntax errors, with the offending line cut to ~80 characters around the column;
* nesting deeper than MAX_DEPTH (PyYAML composes recursively);
* tags other than YAML's core ones (``!mytag``, ``!!python/object``, ``!!binary``...), and scalars a core
  tag cannot read (``!!int four``, the date ``2024-13-45``, an integer of 5000 digits);
* aliases to a node that contains them (a recursive structure) and merge keys (``<<``) whose value is
  not a mapping or a list of mappings.

Merge keys are supported: ``<<: *anchor`` (or ``<<: [*a, *b]``) is flattened while composing, by YAML's
rule (a key written next to ``<<`` wins over a merged one, the first merged mapping over later ones);
merged keys keep the line where they are written (in the anchored mapping).
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent, MappingStartEvent, NodeEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from softsyn.errors import SoftsynError
from softsyn.units import NotFiniteError, UnitError, parse_bytes, parse_percent, parse_time

__all__ = ["YamlReader", "compose", "read_text", "describe", "line_of", "error_at", "MAX_DEPTH", "MAX_INT",
           "MAX_SECONDS", "MAX_BYTES"]

MAX_DEPTH = 64  # softsyn's files nest a few levels; PyYAML composes recursively and would exhaust the stack
SNIPPET = 80  # characters of the offending line quoted in a syntax error
CORE = "tag:yaml.org,2002:"
CORE_TAGS = {CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map")}
MERGE_TAG = CORE + "merge"
CHECKED_SCALARS = {CORE + t for t in ("int", "float", "bool", "timestamp")}  # the tags whose construction can fail
# Upper bounds of what the readers accept: integers feed ONNX Runtime's int32 sequence lengths (GQA's
# seqlens_k); times and sizes keep every sum finite and every report printable.
MAX_INT = 2**31 - 1
MAX_SECONDS = 1e6
MAX_BYTES = 10**18


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(CORE):] if tag.startswith(CORE) else tag


def _short(number: int | float) -> str:
    """A number for a message: a long integer shortened to its first digits and its length."""
    text = str(number)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def snippet(line: str, column: int) -> str:
    """The offending line, stripped, cut to about SNIPPET characters around ``column``."""
    if len(line) <= SNIPPET:
        return line.strip()
    start = max(0, min(column - SNIPPET // 2, len(line) - SNIPPET))
    cut = line[start:start + SNIPPET].strip()
    return ("..." if start > 0 else "") + cut + ("..." if start + SNIPPET < len(line) else "")


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses, in one line naming the file and line, what the readers could not answer."""

    def __init__(self, text: str, source: str, error: type[SoftsynError]):
        super().__init__(text)
        self.source, self.error = source, error
        self.depth = 0
        self.open_anchors: list[str] = []  # anchors of the collections being composed (an alias to one recurses)

    def refuse(self, mark, message: str) -> SoftsynError:
        return self.error(f"{self.source}:{mark.line + 1}: {message}")

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self.open_anchors:
                raise self.refuse(event.start_mark, f"alias *{event.anchor} is inside the node it names "
                                  f"(&{event.anchor}): a recursive structure softsyn cannot read")
            return super().compose_node(parent, index)
        if isinstance(event, NodeEvent) and event.tag not in (None, "!") and event.tag not in CORE_TAGS:
            raise self.refuse(event.start_mark, f"YAML tag {_tag_name(event.tag)!r} is not supported; softsyn "
                              "files take plain strings, numbers, booleans, lists and mappings")
        if not isinstance(event, CollectionStartEvent):
            node = super().compose_node(parent, index)
            if node.tag in CHECKED_SCALARS:
                try:
                    self.yaml_constructors[node.tag](self, node)
                except Exception:  # noqa: BLE001 -- each constructor fails its own way (ValueError, KeyError...)
                    shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
                    raise self.refuse(node.start_mark, f"{shown!r} is not a valid {_tag_name(node.tag)}") from None
            return node
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.refuse(event.start_mark, f"nested deeper than {MAX_DEPTH} levels (softsyn files need a "
                              "few); is a bracket or an indentation off?")
        if event.anchor is not None:
            self.open_anchors.append(event.anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
            if event.anchor is not None:
                self.open_anchors.pop()
        if isinstance(event, MappingStartEvent):
            self.merge(node)
        return node

    def merge(self, node: MappingNode) -> None:
        """Flatten the merge keys of ``node`` (its sources were flattened when they were composed)."""
        sources = [(k, v) for k, v in node.value if k.tag == MERGE_TAG]
        if not sources:
            return
        own = [(k, v) for k, v in node.value if k.tag != MERGE_TAG]
        taken = {k.value for k, _ in own if isinstance(k, ScalarNode)}
        merged = []
        for knode, vnode in sources:
            items = vnode.value if isinstance(vnode, SequenceNode) else [vnode]
            for item in items:
                if not isinstance(item, MappingNode):
                    raise self.refuse(item.start_mark, f"merge key '<<' takes a mapping (<<: *anchor) or a list "
                                      f"of mappings, got {describe(item)}")
                for k, v in item.value:
                    name = k.value if isinstance(k, ScalarNode) else None
                    if name is None or name not in taken:
                        merged.append((k, v))
                        if name is not None:
                            taken.add(name)
        node.value = own + merged


def compose(text: str, source: str, error: type[SoftsynError] = SoftsynError) -> Node | None:
    """The YAML node tree of ``text`` (None for an empty document); every problem is one ``error`` line."""
    loader = None
    try:
        loader = _Loader(text, source, error)  # its reader refuses characters YAML does not allow right away
        return loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        lines = text.splitlines()
        mark = e.problem_mark or e.context_mark
        if e.context_mark is not None and (mark.line >= len(lines) or not lines[mark.line].strip()):
            mark = e.context_mark  # e.g. an unclosed quote: the problem is at the end of the file
        line = mark.line + 1 if mark is not None else 1
        what = " ".join(" ".join(str(x).split())[:120] for x in (e.context, e.problem) if x)
        src = snippet(lines[mark.line], mark.column) if mark is not None and mark.line < len(lines) else ""
        near = f": {src!r}" if src else ""
        raise error(f"{source}:{line}: YAML syntax error: {what}{near}") from None
    except yaml.YAMLError as e:  # the reader's: a character YAML does not allow
        line = text.count("\n", 0, getattr(e, "position", 0)) + 1
        what = " ".join(str(e).split(' in "<unicode string>"')[0].split())[:160]
        raise error(f"{source}:{line}: YAML error: {what}") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_text(path: str | Path, what: str, error: type[SoftsynError] = SoftsynError) -> str:
    """The UTF-8 text of the file ``path`` (named as given); not found, a folder, not text: one ``error`` line."""
    name = str(path)
    p = Path(path)
    if not p.exists():
        raise error(f"{name}: {what} not found")
    if p.is_dir():
        raise error(f"{name}: is a directory, expected a {what}")
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{name}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise error(f"{name}: cannot read: {e.strerror or e}") from None


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

        seen: set[int] = set()

        def walk(node, prefix: str) -> None:
            # a node reached again through an alias is not walked again (aliases of aliases would multiply)
            if id(node) in seen:
                return
            seen.add(id(node))
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
        valid = f"valid: a time {'>' if positive else '>='} 0 and at most {MAX_SECONDS:.0f}s"
        try:
            t = parse_time(raw)
        except NotFiniteError as e:
            raise self.fail(node, key, f"{e}; {valid}") from None
        except UnitError as e:
            raise self.fail(node, key, str(e)) from None
        if positive and t <= 0:
            raise self.fail(node, key, f"must be a positive time, got {raw!r}")
        if not positive and t < 0:
            raise self.fail(node, key, f"must not be negative, got {raw!r}")
        if t > MAX_SECONDS:
            raise self.fail(node, key, f"{raw!r} is too long; {valid}")
        return t

    def size(self, node: Node, key: str) -> int:
        raw = self.scalar(node, key, "a size with a unit, e.g. 80GB or 80GiB")
        valid = f"valid: a size > 0 and at most {MAX_BYTES // 10**12}TB"
        try:
            b = parse_bytes(raw)
        except NotFiniteError as e:
            raise self.fail(node, key, f"{e}; {valid}") from None
        except UnitError as e:
            raise self.fail(node, key, str(e)) from None
        if b <= 0:
            raise self.fail(node, key, f"must be a positive size, got {raw!r}")
        if b > MAX_BYTES:
            raise self.fail(node, key, f"{raw!r} is too large; {valid}")
        return b

    def fraction(self, node: Node, key: str, *, low: float = 0.0, high: float | None = None,
                 open_range: bool = False, why: str = "") -> float:
        """A percentage or fraction in [low, high] (``open_range``: in (low, high)); ``why`` ends the range error."""
        raw = self.scalar(node, key, "a percentage like '1%' or a fraction 0..1")
        if open_range:
            rng = f"above {low:.0%} and below {high:.0%}"
        else:
            rng = f"{low:.0%}..{high:.0%}" if high is not None else f"{low:.0%} or more"
        try:
            f = parse_percent(raw)
        except NotFiniteError as e:
            raise self.fail(node, key, f"{e}; valid: {rng}") from None
        except UnitError as e:
            raise self.fail(node, key, str(e)) from None
        outside = (f <= low or f >= high) if open_range else (f < low or (high is not None and f > high))
        if outside:
            raise self.fail(node, key, f"must be {rng if open_range else 'within ' + rng}, got {raw!r}{why}")
        return f

    def integer(self, node: Node, key: str, minimum: int, maximum: int = MAX_INT) -> int:
        raw = self.scalar(node, key, f"an integer >= {minimum}")
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise self.fail(node, key, f"expected an integer >= {minimum}, got {describe(node)}")
        if raw < minimum:
            raise self.fail(node, key, f"must be an integer >= {minimum}, got {raw}")
        if raw > maximum:
            raise self.fail(node, key, f"must be an integer of at most {maximum}, got {_short(raw)}")
        return raw

    def number(self, node: Node, key: str, minimum: float, maximum: float = 1e6) -> float:
        raw = self.scalar(node, key, f"a number >= {minimum:g}")
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise self.fail(node, key, f"expected a number >= {minimum:g}, got {describe(node)}")
        if not minimum <= raw <= maximum:  # NaN compares false: refused too
            raise self.fail(node, key, f"must be a number >= {minimum:g} and at most {maximum:g}, got {_short(raw)}")
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
