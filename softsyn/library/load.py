"""Reading target libraries: one YAML file per runtime x device, validated into a `Library`.

`softsyn/library/libs/*.yaml` ship with the package (`shipped_libraries`, `load_library("cpu-ort")`); any
other path loads too. A file has a header (library, format, runtime, provider, device, date, and the
`command` that measured it or the `source` it was copied from), measured `ceilings` and `cells`:

    ceilings:                        # SI units
      memory_bandwidth: 1.2e10       # B/s (read + write of a large copy)
      peak_flops: {fp32: 4.5e11, int4: 3e11}   # FLOP/s per precision the provider computes in
      launch_overhead: 2.0e-6        # s per node executed by the runtime (eager)
      launch_overhead_graph: null    # s per node inside a CUDA graph (GPU only)
      run_overhead: 2.0e-5           # s per session.run call; null -> launch_overhead (documented fallback)

A cell is a measured delay table (Liberty's lu_table, one axis per problem-size index; lookup rules in
softsyn.library.interp):

    - op: MatMul
      precision: fp16
      implementation: ort-cuda
      axes: [m, n, k]                # the keys of `sizes` that cost.node_work gives the op
      points: [[1, 16, 256], [4096], [1024, 4096]]   # one increasing grid per axis (index_1, index_2, ...)
      delays: [[[..,..]], ...]       # seconds, nested row-major: shape len(points[0]) x len(points[1]) x ...
      bytes_per_weight: 2
      error: null                    # relative error the cell adds (quantised formats), null if none
      scale: {batch: 1}              # optional: sizes folded out of the table, at their reference values

Every error is one line naming the file, the line and the dotted key (``cells.3.points.1``), through the
shared YAML reader (softsyn.constraints.reader).
"""
from __future__ import annotations

import datetime as _dt
import importlib.resources
import math
import os
from pathlib import Path

import yaml

from softsyn.constraints import YamlReader
from softsyn.constraints.reader import compose, read_text
from softsyn.errors import SoftsynError
from softsyn.library.model import PRECISIONS, Ceilings, Cell, Library, ServingHost, canonical_precision

FORMAT_VERSION = 1
HEADER_KEYS = ("library", "format", "runtime", "provider", "device", "date", "ceilings")
MAX_TABLE = 10**6  # delay-table points per cell; shipped cells have at most a few hundred


class UnknownLibraryError(SoftsynError):
    """No library of that name or path; the message says which and what is valid, for the caller to prefix
    with where the name was given (``file:line: target:`` or ``--target:``)."""


def shipped_libraries() -> list[str]:
    """Names of the libraries shipped in softsyn/library/libs (package data)."""
    root = importlib.resources.files("softsyn.library.libs")
    return sorted(e.name[:-5] for e in root.iterdir() if e.name.endswith(".yaml"))


def default_library() -> str:
    return "cpu-ort"


def _clip(spec: str) -> str:
    """A library name or path as given, cut to 80 characters for a message (a path keeps its end: the file name)."""
    if len(spec) <= 80:
        return spec
    return "..." + spec[-77:] if "/" in spec else spec[:77] + "..."


def _valid_libraries() -> str:
    return f"shipped: {', '.join(shipped_libraries())}, or a path to a .yaml library"


def _positive(reader: YamlReader, key: str, value, allow_null: bool = False) -> float | None:
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # YAML 1.1 reads "1e10" (no dot) as a string
        except (TypeError, ValueError):
            raise reader.at(key, f"must be a positive number (SI units), got {value!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise reader.at(key, f"must be a positive number (SI units), got {value!r}")
    return float(value)


def parse_cell(reader: YamlReader, i: int, raw) -> Cell:
    key = f"cells.{i}"
    if not isinstance(raw, dict):
        raise reader.at(key, "a cell must be a mapping with op, precision, implementation, axes, points, delays")
    for k in ("op", "precision", "axes", "points", "delays"):
        if k not in raw:
            raise reader.at(f"{key}.{k}", "missing")
    precision = canonical_precision(raw["precision"])
    if precision is None:
        raise reader.at(f"{key}.precision", f"unknown precision {raw['precision']!r}; valid: {', '.join(PRECISIONS)}")
    axes = raw["axes"]
    if not isinstance(axes, list) or not axes or not all(isinstance(a, str) for a in axes):
        raise reader.at(f"{key}.axes", "must be a non-empty list of size names, e.g. [m, n, k]")
    points = raw["points"]
    if not isinstance(points, list) or len(points) != len(axes):
        raise reader.at(f"{key}.points", f"must be a list of {len(axes)} grids, one per axis {axes}")
    grids = []
    for a, grid in enumerate(points):
        if not isinstance(grid, list) or not grid:
            raise reader.at(f"{key}.points.{a}", "must be a non-empty list of sizes")
        g = [_positive(reader, f"{key}.points.{a}", v) for v in grid]
        if any(y <= x for x, y in zip(g, g[1:])):
            raise reader.at(f"{key}.points.{a}", f"grid for axis {axes[a]!r} must be strictly increasing, got {grid}")
        grids.append(g)

    if math.prod(len(g) for g in grids) > MAX_TABLE:
        raise reader.at(f"{key}.points", f"a table of {' x '.join(str(len(g)) for g in grids)} points; at most "
                        f"{MAX_TABLE} (aliases can write a huge table in a few lines)")

    def table(node, depth: int, where: str):
        """The delays as nested lists of floats, checked against the grids' shape."""
        if depth == len(grids):
            return _positive(reader, f"{key}.delays", node)
        if not isinstance(node, list) or len(node) != len(grids[depth]):
            raise reader.at(f"{key}.delays", f"shape must be {' x '.join(str(len(g)) for g in grids)} "
                            f"(nested, row-major); wrong length at {where or 'top level'}")
        return [table(sub, depth + 1, f"{where}[{j}]") for j, sub in enumerate(node)]

    delays = table(raw["delays"], 0, "")
    error = raw.get("error")
    if error is not None and (not isinstance(error, (int, float)) or error < 0):
        raise reader.at(f"{key}.error", f"must be null or a non-negative relative error, got {error!r}")
    bpw = raw.get("bytes_per_weight")
    if bpw is not None:
        bpw = _positive(reader, f"{key}.bytes_per_weight", bpw)
    scale = raw.get("scale")
    if scale is not None:
        if not isinstance(scale, dict):
            raise reader.at(f"{key}.scale", "must be a mapping size -> reference value, e.g. {batch: 1, head_dim: 128}")
        scale = {str(k): _positive(reader, f"{key}.scale.{k}", v) for k, v in scale.items()}
    holdout = raw.get("holdout") if isinstance(raw.get("holdout"), dict) else None
    attributes = raw.get("attributes")
    if attributes is not None and (not isinstance(attributes, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in attributes.items())):
        raise reader.at(f"{key}.attributes", f"must be a mapping of node attribute -> integer, e.g. "
                        f"{{accuracy_level: 4}}, got {attributes!r}")
    unknown = sorted(set(attributes or ()) - set(NODE_ATTRIBUTES))
    if unknown or any(attributes[k] not in NODE_ATTRIBUTES[k] for k in attributes or ()):
        # the compile writes these onto its nodes: a library (untrusted) may not set the shape or bits softsyn writes
        raise reader.at(f"{key}.attributes", f"{attributes!r}: valid: " + ", ".join(
            f"{k} in {v.start}..{v.stop - 1}" for k, v in NODE_ATTRIBUTES.items()))
    return Cell(op=str(raw["op"]), precision=precision, implementation=str(raw.get("implementation", "")),
                axes=list(axes), points=grids, delays=delays, bytes_per_weight=bpw,
                error=None if error is None else float(error), scale=scale, holdout=holdout, attributes=attributes)


def read_yaml(text: str, path: Path) -> tuple[YamlReader, object]:
    """(reader with line numbers, plain data) of a library-like YAML file (target or collective library)."""
    reader = YamlReader(str(path))
    root = compose(text, str(path))
    reader.index(root)
    try:
        return reader, reader.data(root)
    except yaml.YAMLError as e:  # e.g. a list as a mapping key
        raise SoftsynError(f"{path}: not valid YAML: {' '.join(str(e).split())[:200]}") from None


def parse_library(text: str, path: Path) -> Library:
    """Validate and build a Library from YAML text (errors name the file, line and key)."""
    reader, data = read_yaml(text, path)
    if not isinstance(data, dict):
        raise SoftsynError(f"{path}: a library must be a YAML mapping with keys {', '.join(HEADER_KEYS)}")
    for k in HEADER_KEYS:
        if data.get(k) in (None, ""):
            raise reader.at(k, "missing (a library header needs " + ", ".join(HEADER_KEYS) + ")")
    if "command" not in data and "source" not in data:
        raise reader.at("command", "missing: say how the ceilings were measured (`command`, or `source` if copied)")
    if data["format"] != FORMAT_VERSION:
        raise reader.at("format", f"unsupported format {data['format']!r}; this softsyn reads format {FORMAT_VERSION}")
    c = data["ceilings"]
    if not isinstance(c, dict):
        raise reader.at("ceilings", "must be a mapping")
    for k in ("memory_bandwidth", "peak_flops", "launch_overhead"):
        if c.get(k) is None:
            raise reader.at(f"ceilings.{k}", "missing")
    bw = _positive(reader, "ceilings.memory_bandwidth", c["memory_bandwidth"])
    pf_raw = c["peak_flops"]
    if not isinstance(pf_raw, dict) or not pf_raw:
        raise reader.at("ceilings.peak_flops", "must be a mapping precision -> FLOP/s, e.g. {fp32: 4.5e11}")
    peak: dict[str, float] = {}
    for p, v in pf_raw.items():
        cp = canonical_precision(p)
        if cp is None:
            raise reader.at(f"ceilings.peak_flops.{p}", f"unknown precision; valid: {', '.join(PRECISIONS)}")
        if v is not None:  # null: the provider does not compute in it (falls back, see peak_flops_for)
            peak[cp] = _positive(reader, f"ceilings.peak_flops.{p}", v)
    if not peak:
        raise reader.at("ceilings.peak_flops", "no precision has a figure")
    launch = _positive(reader, "ceilings.launch_overhead", c["launch_overhead"])
    launch_graph = _positive(reader, "ceilings.launch_overhead_graph", c.get("launch_overhead_graph"), allow_null=True)
    run = _positive(reader, "ceilings.run_overhead", c.get("run_overhead"), allow_null=True)
    if run is None:  # documented fallback: one node's launch
        run = launch
    cells_raw = data.get("cells") or []
    if not isinstance(cells_raw, list):
        raise reader.at("cells", "must be a list of cells")
    cells = [parse_cell(reader, i, raw) for i, raw in enumerate(cells_raw)]
    host = parse_serving_host(reader, data.get("serving_host"))
    header = {k: v for k, v in data.items() if k not in ("ceilings", "cells", "serving_host")}
    if isinstance(header["date"], (_dt.date, _dt.datetime)):
        header["date"] = header["date"].isoformat()
    header = {k: (str(v) if k in ("runtime", "provider", "device", "library") else v) for k, v in header.items()}
    ceilings = Ceilings(memory_bandwidth=bw, peak_flops=peak, launch_overhead=launch,
                        launch_overhead_graph=launch_graph, run_overhead=run)
    return Library(name=str(data["library"]), header=header, ceilings=ceilings, cells=cells, path=path,
                   serving_host=host)


NODE_ATTRIBUTES = {"accuracy_level": range(0, 5)}  # a cell's `attributes` (MatMulNBits' on the CPU), and their values


HOST_FIGURES = ("iteration", "input_bandwidth", "sample_bandwidth", "readback_bandwidth", "bind", "move")
HOST_TEXT = ("device", "date", "command")
HOST_OPTIONAL = ("first_shape_gemm", "first_shape_node")  # s, may be 0 (no first-shape cost measured)


def parse_serving_host(reader: YamlReader, raw) -> ServingHost | None:
    """The optional `serving_host:` block (softsyn.characterize.host writes it): every figure positive, and where it
    was measured."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise reader.at("serving_host", f"must be a mapping with keys {', '.join(HOST_FIGURES + HOST_TEXT)}")
    values = {k: _positive(reader, f"serving_host.{k}", raw.get(k)) for k in HOST_FIGURES}
    for k in HOST_TEXT:
        if raw.get(k) in (None, ""):
            raise reader.at(f"serving_host.{k}", "missing (say where and how the host probe measured it)")
    for k in HOST_OPTIONAL:
        value = raw.get(k)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                                  or not math.isfinite(value)):
            raise reader.at(f"serving_host.{k}", f"must be a number of seconds >= 0, got {value!r}")
        values[k] = None if value is None else float(value)
    return ServingHost(**values, **{k: str(raw[k]) for k in HOST_TEXT})


def load_library(name_or_path: str | os.PathLike) -> Library:
    """Load a shipped library by name ("cpu-ort", "h200-ort-cuda") or any library YAML by path."""
    spec = os.fspath(name_or_path)
    looks_like_path = spec.endswith((".yaml", ".yml")) or os.sep in spec or "/" in spec
    if looks_like_path or os.path.isfile(spec):
        path = Path(spec)
        if not os.path.isfile(spec):  # False, not an OSError, for a name too long to be a file
            raise UnknownLibraryError(f"library file {_clip(spec)} not found; {_valid_libraries()}")
        text = read_text(path, "library file")
    else:
        res = importlib.resources.files("softsyn.library.libs") / f"{spec}.yaml"
        if not res.is_file():
            raise UnknownLibraryError(f"unknown library {_clip(spec)!r}; {_valid_libraries()}")
        path = Path(str(res))
        text = res.read_text()
    return parse_library(text, path)
