"""Timing, area and accuracy constraints: the SDC of softsyn, written in YAML.

`load_constraints(path)` reads a constraints file and returns a `Constraints`,
everything converted to SI (seconds, bytes, fractions). Any problem raises a
`ConstraintsError` whose message is one line::

    constraints.yaml:1: clock_period: unknown time unit 'mss' in '2000mss'; valid units: ns, us (µs), ms, s, min
    constraints.yaml:3: unknown key 'clok_period'; did you mean 'clock_period'? valid keys: ...

The short form that deployment guides write loads as is::

    clock_period: 2000ms
    input_delay:
      image: 100ms
      text: 10ms
    output_delay: 50ms
    area_constraint: 80GB

The full form adds ``target``, ``workload``, ``path_groups``, ``clock_uncertainty``,
``accuracy``, ``precision``, ``dont_touch``, ``kv_cache``, ``parallel`` and ``serving`` (see the `constraints/`
examples and `KEYS` below).

Decisions:

* Line numbers come from the composed YAML node tree (`softsyn.constraints.reader`);
  every key's 1-based line is kept in ``Constraints.key_lines`` (dotted key path ->
  line) so later stages (which know the netlist's ports) can raise errors pointing
  at the file with ``Constraints.error(key, message)``.
* ``input_delay`` / ``output_delay``: a single time is stored under ``"*"``; a
  mapping may also name ``"*"`` explicitly as the default for other ports. A path group's own
  ``input_delay`` replaces the top-level one for that group (a decode step does not tokenise).
* An empty file, a top-level that is not a mapping, duplicate keys and a key with
  no value (``clock_period:``) are errors. A section with no value
  (``workload:``) means its defaults.
* Percentages (``accuracy``) take ``"1%"`` or a fraction in 0..1 (`parse_percent`); ``min_top1`` lies in
  0%..100%, ``max_rel_error`` strictly between 0% and 100% (100% would pass an all-zero output).
* Every quantity is finite and bounded (the reader's MAX_SECONDS, MAX_BYTES, MAX_INT): ``1e400ms`` or
  ``.inf`` is an error naming the valid range, never an infinite clock.
* ``path_groups.*.dims`` names are checked against the design's dims when the groups are resolved
  (`softsyn.design`), where they are known; so is ``target`` (file and line of the key when no library has
  that name).
* ``path_groups.*.batch`` is the scenario's batch. On a vision-language composite every prefill group is an image
  task by default (one image per sequence: OCR, GUI agent, visual math); ``images: N`` gives the images per sequence
  (0: a text-only group) and ``image_size`` (``WIDTHxHEIGHT``; ``image``, its first spelling, is read the same)
  the images' size (one size per file, checked by the design). A group of ``kind: encoder`` times the vision
  encoder alone.
* Precision and KV dtype names are matched case-insensitively and stored lower case.
* ``accuracy.fallback`` (``bf16`` or ``none``): what the compile loop falls back to when its best map is over the
  accuracy budget (docs/accuracy.md); any other value is an error naming the key and both values (exit 2).
* ``target``: a library name (``cpu-ort``) is kept as written; a relative path
  (contains ``/`` or ends in ``.yaml``/``.yml``) is resolved against the directory
  of the constraints file when the file exists there.
* Consistency checks: ``precision.default`` must be in ``precision.allowed``;
  ``clock_uncertainty`` must be smaller than every clock period; ``kv_cache.max_length``
  must not be below an explicitly given ``workload.context_len``; ``accuracy.fallback: bf16`` needs bf16 in
  ``precision.allowed``.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from softsyn.constraints.reader import YamlReader, compose, describe, error_at, line_of, read_text
from softsyn.constraints.serving import SERVING_KEYS, Lengths, Serving, read_serving
from softsyn.errors import SoftsynError

__all__ = [
    "ConstraintsError",
    "Workload",
    "PathGroupSpec",
    "Accuracy",
    "Precision",
    "KVCache",
    "Parallel",
    "Constraints",
    "Serving",
    "Lengths",
    "load_constraints",
    "parse_constraints",
    "PRECISIONS",
    "KV_DTYPES",
    "FALLBACKS",
    "GROUP_KINDS",
    "KEYS",
    "shared_buffer_length",
]

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
KV_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8", "int8")
# accuracy.fallback: what the compile loop falls back to when its best map is over the accuracy budget (bf16: the
# uniform bf16 design; none: the design keeps the precision it had before the map, as without the key)
FALLBACKS: tuple[str, ...] = ("bf16", "none")
GROUP_KINDS: tuple[str, ...] = ("prefill", "decode", "encoder")
MODALITIES: tuple[str, ...] = ("text", "image", "audio")

# Valid keys per section, in the order they are listed in messages.
KEYS: dict[str, tuple[str, ...]] = {
    "": (
        "target", "clock_period", "clock_uncertainty", "input_delay", "output_delay",
        "area_constraint", "workload", "path_groups", "accuracy", "precision",
        "dont_touch", "kv_cache", "parallel", "serving",
    ),
    "workload": ("batch", "prompt_len", "context_len", "concurrency"),
    "path_group": ("clock_period", "weight", "critical_range", "kind", "dims", "inputs", "input_delay", "batch",
                   "images", "image_size", "image"),
    "accuracy": ("max_rel_error", "min_top1", "fallback"),
    "precision": ("allowed", "default"),
    "kv_cache": ("dtype", "max_length"),
    "parallel": ("tensor", "devices", "weights"),
    "serving": SERVING_KEYS["serving"],
}
MAX_IMAGES = 64  # images per sequence in one group (each adds its grid's tokens to the prompt)
MAX_DEVICES = 64  # devices of one tensor-parallel group (one NVLink domain; NVL72 is the largest today)

# Words people write for a key; only used to suggest the right one.
_SYNONYMS = {
    "clock": "clock_period", "period": "clock_period", "latency": "clock_period",
    "uncertainty": "clock_uncertainty", "jitter": "clock_uncertainty",
    "area": "area_constraint", "max_area": "area_constraint", "memory": "area_constraint",
    "vram": "area_constraint", "library": "target", "lib": "target", "device": "target",
    "groups": "path_groups", "path_group": "path_groups", "scenarios": "path_groups",
    "dont_use": "dont_touch", "keep": "dont_touch", "kv": "kv_cache",
    "batch_size": "batch", "seq_len": "prompt_len", "sequence_length": "prompt_len",
    "context": "context_len", "max_error": "max_rel_error", "rel_error": "max_rel_error",
    "tp": "tensor", "tensor_parallel": "tensor", "tensor_parallel_size": "tensor", "gpus": "devices",
    "top1": "min_top1", "dtype": "dtype", "max_len": "max_length", "period_ms": "clock_period",
}


class ConstraintsError(SoftsynError):
    """A constraints file is wrong; the message is one line: ``file:line: key: what; valid: ...``."""


# ------------------------------------------------------------------------------ model


@dataclass
class Workload:
    batch: int = 1
    prompt_len: int = 512
    context_len: int = 512  # decode is timed at this many cached tokens
    concurrency: int = 1


@dataclass
class PathGroupSpec:
    name: str
    clock_period: float | None = None  # s; None: the global clock_period
    weight: float = 1.0
    critical_range: float = 0.0  # s
    kind: str | None = None  # "prefill" | "decode" | "encoder"
    dims: dict[str, int] = field(default_factory=dict)  # scenario dims, e.g. {"batch": 1, "past": 4096}
    inputs: list[str] | None = None  # input ports the group uses; None: all
    input_delay: dict[str, float] | None = None  # replaces the top-level input_delay for this group (a decode step
    # does not tokenise: its token comes from the sampler)
    batch: int | None = None  # the scenario's batch (dims.batch), as the guides write it
    image: tuple[int, int] | None = None  # (width, height) of the group's images (`image_size`, or `image` as first
    # written); None: the design's one image size
    images: int | None = None  # images per sequence; None: the default (1 for a composite's prefill group: an image
    # task; 0 for a decode step); 0: a text-only group


@dataclass
class Accuracy:
    max_rel_error: float | None = None  # fraction, vs the fp32 reference
    min_top1: float | None = None  # fraction of top-1 agreement with the fp32 reference
    fallback: str | None = None  # FALLBACKS: the compile loop's design when its best map is over budget (None: none)


@dataclass
class Precision:
    allowed: list[str] = field(default_factory=lambda: list(PRECISIONS))
    default: str | None = None


@dataclass
class KVCache:
    dtype: str | None = None
    max_length: int | None = None


@dataclass
class Parallel:
    tensor: int | None = None  # tensor-parallel degree N; None: one device
    devices: int = 8  # the most devices the plan may use (the smallest N that fits is searched up to it)
    weights: str | None = None  # what-if: the plan's weight matmuls as MatMulNBits at int8/int4 (estimate)


@dataclass
class Constraints:
    source: str
    clock_period: float | None = None  # s
    clock_uncertainty: float = 0.0  # s
    input_delay: dict[str, float] = field(default_factory=dict)  # port | modality | "*" -> s
    output_delay: dict[str, float] = field(default_factory=dict)  # port | "*" -> s
    area_constraint: float | None = None  # bytes
    target: str | None = None
    workload: Workload = field(default_factory=Workload)
    path_groups: dict[str, PathGroupSpec] = field(default_factory=dict)
    accuracy: Accuracy = field(default_factory=Accuracy)
    precision: Precision = field(default_factory=Precision)
    dont_touch: list[str] = field(default_factory=list)
    kv_cache: KVCache = field(default_factory=KVCache)
    parallel: Parallel = field(default_factory=Parallel)
    serving: Serving | None = None  # a load to simulate (softsyn.constraints.serving); None: no serving checks
    # dotted key path ("path_groups.decode.clock_period") -> 1-based line in `source`
    key_lines: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def default(cls) -> "Constraints":
        """No constraints file: everything default."""
        return cls(source="<defaults>")

    def input_delay_for(self, port: str, modality: str | None = None, group: str | None = None) -> float:
        """Delay at an input port: by port name, then by modality, then ``"*"``, else 0; from the group's own
        input_delay where `group` has one."""
        spec = self.path_groups.get(group) if group is not None else None
        d = spec.input_delay if spec is not None and spec.input_delay is not None else self.input_delay
        if port in d:
            return d[port]
        if modality is not None and modality in d:
            return d[modality]
        return d.get("*", 0.0)

    def output_delay_for(self, port: str) -> float:
        """Delay after an output port: by port name, then ``"*"``, else 0."""
        return self.output_delay.get(port, self.output_delay.get("*", 0.0))

    def period_for(self, group: str) -> float | None:
        """The group's clock_period, else the global clock_period (None: unconstrained)."""
        spec = self.path_groups.get(group)
        if spec is not None and spec.clock_period is not None:
            return spec.clock_period
        return self.clock_period

    def line_of(self, key: str) -> int | None:
        """1-based line of a dotted key path in the source file, or of its nearest parent."""
        return line_of(self.key_lines, key)

    def error(self, key: str, message: str) -> ConstraintsError:
        """A ConstraintsError pointing at ``key`` in the source file (for checks made later,
        e.g. against the netlist's ports): ``file:line: key: message``."""
        return error_at(self.source, self.key_lines, key, message, ConstraintsError)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (SI units), for reports and netlist.json."""
        d = asdict(self)
        d.pop("key_lines", None)
        return d


# ------------------------------------------------------------------------------ loading


def load_constraints(path: str | os.PathLike | None) -> Constraints:
    """Read and validate a constraints YAML file. ``None`` gives `Constraints.default()`."""
    if path is None:
        return Constraints.default()
    name = os.fspath(path)
    text = read_text(name, "constraints file", ConstraintsError)
    return parse_constraints(text, source=name, base_dir=Path(name).parent)


def parse_constraints(text: str, source: str = "<string>", base_dir: str | os.PathLike | None = None) -> Constraints:
    """Validate constraints given as YAML text; ``source`` names it in messages."""
    root = compose(text, source, ConstraintsError)
    if root is None or (isinstance(root, ScalarNode) and root.tag == "tag:yaml.org,2002:null"):  # "" and "~" alike: nothing given
        what = "empty constraints file" if root is None else f"the document is null ({root.value or 'empty'})"
        raise ConstraintsError(
            f"{source}:{1 if root is None else root.start_mark.line + 1}: {what}; expected a mapping with keys such "
            f"as clock_period, input_delay, output_delay, area_constraint"
        )
    return _Reader(source, base_dir).read(root)


GLOB_CHARS = re.compile(r"[A-Za-z0-9_.*?/:\-\[\]!]+")  # scope names (module paths) and fnmatch's wildcards


def glob_problem(pattern: str) -> str | None:
    """Why `pattern` is no hierarchy glob fnmatch reads as meant (None when it is one): a character no scope holds
    (blanks, control characters), a `[` never closed (fnmatch would match it literally) or an empty `[]`/`[!]`."""
    bad = GLOB_CHARS.sub("", pattern)
    if bad:
        return f"character {bad[0]!r} is in no scope name"
    i = 0
    while i < len(pattern):
        if pattern[i] == "]":
            return f"']' at {i} closes no '['"
        if pattern[i] != "[":
            i += 1
            continue
        end = pattern.find("]", i + 1 + (pattern[i + 1:i + 2] == "!"))
        if end < 0:
            return f"'[' at {i} is never closed"
        body = pattern[i + 1:end].lstrip("!")
        if not body:
            return f"'[' at {i} holds no characters"
        if "[" in body:
            return f"'[' at {i} holds another '['"
        i = end + 1
    return None


class _Reader(YamlReader):
    """The constraints file's sections, read node by node."""

    def __init__(self, source: str, base_dir: str | os.PathLike | None):
        super().__init__(source, ConstraintsError, _SYNONYMS)
        self.base_dir = Path(base_dir) if base_dir is not None else None

    def delays(self, node: Node, key: str) -> dict[str, float]:
        """A single time (stored under "*") or a mapping port/modality -> time."""
        if isinstance(node, MappingNode):
            entries = self.mapping(node, key, what="a time or a mapping of port -> time")
            return {name: self.time(v, f"{key}.{name}") for name, (_, v) in entries.items()}
        if isinstance(node, SequenceNode):
            names = f"port or modality ({', '.join(MODALITIES)})" if key.endswith("input_delay") else "port"
            raise self.fail(node, key, f"expected a time (e.g. 50ms) or a mapping of {names} -> time, got a list")
        return {"*": self.time(node, key)}

    # -- sections --------------------------------------------------------------

    def read(self, root: Node) -> Constraints:
        top = self.mapping(root, "", KEYS[""])
        c = Constraints(source=self.source)
        c.key_lines = self.key_lines
        get = lambda k: top[k][1] if k in top else None  # noqa: E731

        if (n := get("target")) is not None:
            c.target = self.resolve_target(self.string(n, "target", "a library name (e.g. cpu-ort) or path"))
        if (n := get("clock_period")) is not None:
            c.clock_period = self.time(n, "clock_period", positive=True)
        if (n := get("clock_uncertainty")) is not None:
            c.clock_uncertainty = self.time(n, "clock_uncertainty")
        if (n := get("input_delay")) is not None:
            c.input_delay = self.delays(n, "input_delay")
        if (n := get("output_delay")) is not None:
            c.output_delay = self.delays(n, "output_delay")
        if (n := get("area_constraint")) is not None:
            c.area_constraint = self.size(n, "area_constraint")
        if (n := get("workload")) is not None:
            c.workload = self.workload(n)
        if (n := get("path_groups")) is not None:
            c.path_groups = self.path_groups(n)
        if (n := get("accuracy")) is not None:
            c.accuracy = self.accuracy(n)
        if (n := get("precision")) is not None:
            c.precision = self.precision(n)
        if (n := get("dont_touch")) is not None:
            c.dont_touch = self.string_list(n, "dont_touch", "hierarchy globs (e.g. lm_head, model.layers.0.*)")
            items = n.value if isinstance(n, SequenceNode) else [n]
            for i, (pattern, item) in enumerate(zip(c.dont_touch, items)):
                problem = glob_problem(pattern)
                if problem:
                    where = "dont_touch" if isinstance(n, ScalarNode) else f"dont_touch[{i}]"
                    raise self.fail(item, where, f"{pattern!r} is not a hierarchy glob: {problem}; valid: dotted "
                                                 "scopes with * ? [seq] (e.g. lm_head, model.layers.0.*, "
                                                 "model.layers.[0-3].mlp)")
        if (n := get("kv_cache")) is not None:
            c.kv_cache = self.kv_cache(n)
        if (n := get("parallel")) is not None:
            c.parallel = self.parallel(n)
        if (n := get("serving")) is not None:
            c.serving = read_serving(self, n)

        self.check(c, top)
        return c

    def resolve_target(self, target: str) -> str:
        looks_like_path = "/" in target or os.sep in target or target.endswith((".yaml", ".yml"))
        if looks_like_path and self.base_dir is not None and not os.path.isabs(target):
            candidate = self.base_dir / target
            if os.path.exists(candidate):  # False, not an OSError, for a name too long to be a file
                return str(candidate)
        return target

    def workload(self, node: Node) -> Workload:
        e = self.mapping(node, "workload", KEYS["workload"])
        w = Workload()
        for name, (_, v) in e.items():
            setattr(w, name, self.integer(v, f"workload.{name}", 1))
        return w

    def path_groups(self, node: Node) -> dict[str, PathGroupSpec]:
        groups = self.mapping(node, "path_groups", what="a mapping of group name -> settings")
        return {name: self.path_group(name, v) for name, (_, v) in groups.items()}

    def path_group(self, name: str, node: Node) -> PathGroupSpec:
        key = f"path_groups.{name}"
        if not name.strip():
            raise self.fail(node, "path_groups", "a path group needs a name")
        e = self.mapping(node, key, KEYS["path_group"])
        g = PathGroupSpec(name=name)
        if "clock_period" in e:
            g.clock_period = self.time(e["clock_period"][1], f"{key}.clock_period", positive=True)
        if "weight" in e:
            g.weight = self.number(e["weight"][1], f"{key}.weight", 0.0)
        if "critical_range" in e:
            g.critical_range = self.time(e["critical_range"][1], f"{key}.critical_range")
        if "kind" in e:
            g.kind = self.choice(e["kind"][1], f"{key}.kind", GROUP_KINDS, "path group kind")
        if "dims" in e:
            dims = self.mapping(e["dims"][1], f"{key}.dims", what="a mapping of dim name -> integer")
            # a dim of 0 is an empty tensor (no work: every clock met); only past, the cached tokens, may be none
            g.dims = {d: self.integer(v, f"{key}.dims.{d}", 0 if d == "past" else 1) for d, (_, v) in dims.items()}
        if "inputs" in e:
            g.inputs = self.string_list(e["inputs"][1], f"{key}.inputs", "input port names")
        if "input_delay" in e:
            g.input_delay = self.delays(e["input_delay"][1], f"{key}.input_delay")
        if "batch" in e:
            g.batch = self.integer(e["batch"][1], f"{key}.batch", 1)
        if "image" in e and "image_size" in e:
            raise self.fail(e["image"][1], f"{key}.image", "give image_size or image (the same key), not both")
        size_key = "image_size" if "image_size" in e else "image" if "image" in e else None
        if size_key:
            node = e[size_key][1]
            text = self.string(node, f"{key}.{size_key}", "an image size WIDTHxHEIGHT")
            m = re.match(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$", text)
            if not m or min(int(m.group(1)), int(m.group(2))) < 1:
                raise self.fail(node, f"{key}.{size_key}", f"{text!r} is not an image size; valid: WIDTHxHEIGHT "
                                "in pixels, e.g. 448x448 or 1280x720")
            g.image = (int(m.group(1)), int(m.group(2)))
        if "images" in e:
            g.images = self.integer(e["images"][1], f"{key}.images", 0, MAX_IMAGES)
            if g.images == 0 and g.image is not None:
                raise self.fail(e["images"][1], f"{key}.images", f"0 with {size_key} given: a text-only group has no "
                                f"image size; drop {size_key}, or give images >= 1")
        return g

    def accuracy(self, node: Node) -> Accuracy:
        e = self.mapping(node, "accuracy", KEYS["accuracy"])
        a = Accuracy()
        if "max_rel_error" in e:
            # verify's rel error is max|compiled - reference| / max|reference|: 100% would pass an all-zero output,
            # 0% fails any fused model on rounding alone
            a.max_rel_error = self.fraction(e["max_rel_error"][1], "accuracy.max_rel_error", high=1.0, open_range=True,
                                            why=" (relative to the reference's largest value; 100% would pass an "
                                                "all-zero output)")
        if "min_top1" in e:
            a.min_top1 = self.fraction(e["min_top1"][1], "accuracy.min_top1", high=1.0)
        if "fallback" in e:
            a.fallback = self.choice(e["fallback"][1], "accuracy.fallback", FALLBACKS, "fallback")
        return a

    def precision(self, node: Node) -> Precision:
        e = self.mapping(node, "precision", KEYS["precision"])
        p = Precision()
        if "allowed" in e:
            vnode = e["allowed"][1]
            items = vnode.value if isinstance(vnode, SequenceNode) else [vnode]
            if isinstance(vnode, MappingNode) or self.is_null(vnode):
                raise self.fail(vnode, "precision.allowed",
                                f"expected a list of precisions ({', '.join(PRECISIONS)}), got {describe(vnode)}")
            if not items:
                raise self.fail(vnode, "precision.allowed", f"must name at least one of {', '.join(PRECISIONS)}")
            allowed: list[str] = []
            for item in items:
                name = self.choice(item, "precision.allowed", PRECISIONS, "precision")
                if name not in allowed:
                    allowed.append(name)
            p.allowed = allowed
        if "default" in e:
            dnode = e["default"][1]
            p.default = self.choice(dnode, "precision.default", PRECISIONS, "precision")
            if p.default not in p.allowed:
                raise self.fail(dnode, "precision.default",
                                f"{p.default!r} is not in precision.allowed; valid: {', '.join(p.allowed)}")
        return p

    def kv_cache(self, node: Node) -> KVCache:
        e = self.mapping(node, "kv_cache", KEYS["kv_cache"])
        k = KVCache()
        if "dtype" in e:
            k.dtype = self.choice(e["dtype"][1], "kv_cache.dtype", KV_DTYPES, "KV cache dtype")
        if "max_length" in e:
            k.max_length = self.integer(e["max_length"][1], "kv_cache.max_length", 1)
        return k

    def parallel(self, node: Node) -> Parallel:
        e = self.mapping(node, "parallel", KEYS["parallel"])
        p = Parallel()
        if "devices" in e:
            p.devices = self.integer(e["devices"][1], "parallel.devices", 1, MAX_DEVICES)
        if "weights" in e:
            p.weights = self.choice(e["weights"][1], "parallel.weights", ("int8", "int4"), "weight precision")
        if "tensor" in e:
            p.tensor = self.integer(e["tensor"][1], "parallel.tensor", 1, MAX_DEVICES)
            if p.tensor > p.devices and "devices" in e:
                raise self.fail(e["tensor"][1], "parallel.tensor",
                                f"{p.tensor} is more than parallel.devices ({p.devices})")
        return p

    def check(self, c: Constraints, top: dict[str, tuple[Node, Node]]) -> None:
        """Checks across keys."""
        if c.clock_uncertainty > 0:
            unode = top["clock_uncertainty"][1]
            periods = [("clock_period", c.clock_period)] + [
                (f"path_groups.{g.name}.clock_period", g.clock_period) for g in c.path_groups.values()
            ]
            for name, period in periods:
                if period is not None and c.clock_uncertainty >= period:
                    raise self.fail(unode, "clock_uncertainty",
                                    f"{self.raw['clock_uncertainty']} is not smaller than {name} "
                                    f"({self.raw[name]}); nothing would be left of the period")
        if c.kv_cache.max_length is not None and "workload.context_len" in self.key_lines:
            if c.kv_cache.max_length < c.workload.context_len:
                raise self.at("kv_cache.max_length", f"{c.kv_cache.max_length} is smaller than workload.context_len "
                              f"({c.workload.context_len}); the KV cache must hold the context")
        if c.accuracy.fallback == "bf16" and "bf16" not in c.precision.allowed:
            raise self.at("accuracy.fallback", f"bf16 is not in precision.allowed ({', '.join(c.precision.allowed)}); "
                          "add bf16 to precision.allowed, or valid: accuracy.fallback none")


def shared_buffer_length(cons) -> tuple[int, str]:
    """(the shared KV buffer's length, where it came from): kv_cache.max_length, else the workload's longest sequence."""
    if cons.kv_cache.max_length:
        return cons.kv_cache.max_length, "kv_cache.max_length"
    w = cons.workload
    return max(w.prompt_len, w.context_len + 1), "workload: max(prompt_len, context_len + 1)"
