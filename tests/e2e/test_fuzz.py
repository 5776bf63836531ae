"""Property-based fuzzing (issue 12) with hypothesis: the ONNX frontend, the constraints loader and the
analysis-JSON reader.

Whatever the input, softsyn times it or refuses it with a SoftsynError (the CLI: exit 0/1, or 2 with one
line), never an internal error (exit 3, a traceback) or a hang; each example runs under an alarm. The
example budgets are fixed and the runs derandomized, so the suite is reproducible and takes ~40 s.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from softsyn.cli import run
from softsyn.constraints.model import KEYS, Constraints, ConstraintsError, parse_constraints
from softsyn.design import Design
from softsyn.errors import SoftsynError
from softsyn.frontends import read_design
from softsyn.library import load_library
from reports import REPORTS, from_json, to_json

PER_EXAMPLE_S = 30
FUZZ = settings(max_examples=300, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE, TensorProto.INT64,
          TensorProto.INT8, TensorProto.BOOL, TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.FLOAT8E4M3FN,
          TensorProto.UINT4, TensorProto.UNDEFINED]
# (op, domain, inputs): standard ops, an op ONNX does not have, an op of a domain nobody knows
OPS = [("Relu", "", 1), ("Neg", "", 1), ("Add", "", 2), ("MatMul", "", 2), ("Concat", "", 2), ("Identity", "", 1),
       ("Cast", "", 1), ("Frobnicate", "", 1), ("Custom", "my.ops", 2)]
NAMES = ["", "", "n", "n", "dup", "Relu_0", "x"]


@contextlib.contextmanager
def deadline():
    """Fail an example that runs over PER_EXAMPLE_S (a hang) instead of waiting for it."""
    def expire(*_):
        raise TimeoutError(f"an example ran over {PER_EXAMPLE_S} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(PER_EXAMPLE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def softsyn(*args) -> tuple[int, str]:
    """(exit status, stderr) of `softsyn ARGS` in this process, failing on a hang."""
    err = io.StringIO()
    with deadline(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            run([str(a) for a in args])
        except SystemExit as exc:
            return exc.code, err.getvalue()
    raise AssertionError("softsyn returned without an exit status")


def assert_documented(code: int, err: str) -> None:
    assert code in (0, 1, 2), err
    if code == 2:
        assert err.startswith("softsyn: error: ") and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------------------------------ ONNX frontend

dims = st.one_of(st.integers(0, 4), st.sampled_from(["batch", "seq", "n"]), st.none())
shapes = st.one_of(st.none(), st.lists(dims, max_size=3))


@st.composite
def graphs(draw) -> onnx.ModelProto:
    """Small graphs with repeated and empty node names, cycles (inputs read from later nodes), dangling
    values, unknown ops and odd dtypes."""
    inputs = [helper.make_tensor_value_info(f"in{i}", draw(st.sampled_from(DTYPES)), draw(shapes))
              for i in range(draw(st.integers(1, 2)))]
    count = draw(st.integers(1, 6))
    outputs = [draw(st.sampled_from([f"v{i}"] * 40 + ["v0", "in0"])) for i in range(count)]  # repeats: invalid
    nodes = []
    for i in range(count):
        op, domain, arity = draw(st.sampled_from(OPS))
        pool = [v.name for v in inputs] + outputs[:i]
        kinds = st.sampled_from(["earlier"] * 24 + ["any", "ghost", "omitted"])  # "any" may be later: a cycle
        picks = {"earlier": st.sampled_from(pool), "any": st.sampled_from(outputs), "ghost": st.just("ghost"),
                 "omitted": st.just("")}
        args = [draw(picks[draw(kinds)]) for _ in range(arity)]
        attrs = {"axis": 0} if op == "Concat" else {"to": draw(st.sampled_from(DTYPES[:7]))} if op == "Cast" else {}
        nodes.append(helper.make_node(op, args, [outputs[i]], name=draw(st.sampled_from(NAMES)), domain=domain,
                                      **attrs))
    ends = draw(st.lists(st.sampled_from(outputs * 20 + ["ghost_out"]), min_size=1, max_size=2))
    graph = helper.make_graph(nodes, "fuzz", inputs,
                              [helper.make_tensor_value_info(e, draw(st.sampled_from(DTYPES)), draw(shapes))
                               for e in ends])
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid("my.ops", 1)] if draw(st.booleans()) else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


LIBRARY = load_library("cpu-ort")  # parsed once: the YAML parse would be most of each example's time


@FUZZ
@given(graphs())
def test_any_small_graph_is_timed_or_refused_with_a_softsyn_error(model):
    """read_design, analyze and every report (what `softsyn analyze` runs), in this process; SoftsynError
    is the documented refusal (the CLI prints it in one line, exit 2)."""
    # in a temp folder, which must hold nothing else afterwards: Netlist.bind once left ORT's temp file there
    with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp), deadline():
        path = Path(tmp) / "fuzz.onnx"
        path.write_bytes(model.SerializeToString())
        try:
            design = Design(read_design(str(path), progress=False), Constraints.default(), LIBRARY, progress=False)
            analysis = design.analyze()
        except SoftsynError as exc:
            assert len(str(exc).splitlines()) == 1, exc
            event("refused: " + str(exc).split(": ", 2)[-1][:40])
            return
        event("timed")
        for render in REPORTS.values():
            render(analysis)
        assert from_json(to_json(analysis)).groups[0].name == analysis.groups[0].name
        assert os.listdir(tmp) == ["fuzz.onnx"]


def test_garbage_is_not_an_onnx_model(tmp_path):
    for name, data in (("empty.onnx", b""), ("text.onnx", b"not a model"), ("cut.onnx", b"\x08\x0a\x12\xff")):
        (tmp_path / name).write_bytes(data)
        code, err = softsyn("analyze", tmp_path / name, "-q")
        assert_documented(code, err)
        assert code == 2 and ("cannot load ONNX model" in err or "the graph has no outputs" in err), err


# ------------------------------------------------------------------------------------------ constraints

# Scalars as written in a file: times, sizes and percentages with and without units, numbers that overflow,
# are negative, infinite or NaN, names, booleans, dates (one impossible), huge integers, odd characters.
# Each pool lists values that are valid for some key of its kind first, then invalid ones (VALID: how many).
TIMES = ["600ms", "2 s", "250us", "1.5min", "10ms", "-5ms", "0s", "1e400ms", "1e-400s", "1e300s", "600", "2000mss",
         ".inf"]
SIZES = ["80GB", "2 GiB", "1e18B", "1e400GB", "-1GB", "0B", "80G", "2e18B"]
PERCENTS = ["5%", "0.5", "1%", "150%", "100%", "0%", "1e400%", "1", "5", "-1%", ".nan"]
INTEGERS = ["1", "4", "2147483647", "0", "-1", "2147483648", "99999999999999999999999", "9" * 5000, "1.5", "yes"]
NAMES = ["fp16", "INT8", "decode", "prefill", "x", "lm_head", "model.layers.0.*", "fp99", "encoder", "input_ids",
         "cpu-ort", "nosuch", "lib/x.yaml"]
VALID = {id(TIMES): 5, id(SIZES): 3, id(PERCENTS): 3, id(INTEGERS): 3, id(NAMES): 7}
OTHER = ["null", "~", "2024-01-01", "2024-13-45", "''", "'*'", '"\\u0000"', "x" * 300, "1.0e+400", "-.inf"]
POOLS = {**dict.fromkeys(["clock_period", "clock_uncertainty", "critical_range", "input_delay", "output_delay", "text",
                          "'*'"], TIMES),
         "area_constraint": SIZES, "max_rel_error": PERCENTS, "min_top1": PERCENTS,
         **dict.fromkeys(["batch", "prompt_len", "context_len", "concurrency", "max_length", "weight", "past", "seq",
                          "bogus_dim"], INTEGERS),
         **dict.fromkeys(["kind", "dtype", "default", "allowed", "target", "inputs", "dont_touch"], NAMES)}
SCALARS = TIMES + SIZES + PERCENTS + INTEGERS + NAMES + OTHER
TAGS = [""] * 80 + ["!mytag ", "!!str ", "!!int ", "!!float ", "!!bool ", "!!python/object:os.system ", "!!binary ",
                    "!!set ", "!!timestamp "]
JUNK_KEYS = ["clok_period", "bogus_dim", "batch", "past", "seq", "text", "decode", "'*'", "''", "<<", "1", "dims"]
ALL_KEYS = sorted({k for keys in KEYS.values() for k in keys}) + JUNK_KEYS


def _flow(items: list[str], mapping: bool) -> str:
    return ("{" + ", ".join(items) + "}") if mapping else ("[" + ", ".join(items) + "]")


@st.composite
def yaml_values(draw, key: str = "", depth: int = 0, wild: bool = True) -> str:
    """One YAML value in flow style for ``key``: a scalar of the key's kind (valid or not), or, ``wild``, also any
    scalar (maybe tagged), a number, an alias (maybe undefined), a (deeply) nested list, or a mapping."""
    kinds = ["typed"] * 40 + ["scalar"] * 2 + ["number", "alias", "list", "map", "deep"] if wild and depth < 3 else \
        ["typed"]
    kind = draw(st.sampled_from(kinds))
    if kind == "typed" or kind == "scalar":
        pool = POOLS.get(key, SCALARS) if kind == "typed" else SCALARS
        if not wild and id(pool) in VALID and draw(st.integers(0, 3)):  # tame files: mostly values that can be valid
            pool = pool[:VALID[id(pool)]]
        return (draw(st.sampled_from(TAGS)) if wild else "") + draw(st.sampled_from(pool))
    if kind == "number":
        return repr(draw(st.one_of(st.integers(-10**30, 10**30), st.floats(allow_nan=True, allow_infinity=True))))
    if kind == "alias":
        return draw(st.sampled_from(["*a", "*b", "*undefined"]))
    if kind == "deep":
        n = draw(st.sampled_from([2, 30, 63, 64, 65, 500]))
        return "[" * n + "]" * n
    anchor = draw(st.sampled_from([""] * 6 + ["&a ", "&b "]))
    if kind == "list":
        return anchor + _flow([draw(yaml_values(key, depth + 1)) for _ in range(draw(st.integers(0, 3)))], False)
    keys = [draw(st.sampled_from(ALL_KEYS)) for _ in range(draw(st.integers(0, 4)))]
    return anchor + _flow([f"{k}: {draw(yaml_values(k, depth + 1))}" for k in keys], True)


@st.composite
def constraints_texts(draw) -> str:
    """A constraints file in block style: mostly valid top-level keys, each section mostly its own keys. Half
    the files are tame (valid keys, scalars of the right kind, valid or not) so that many reach the timing."""
    wild = draw(st.booleans())
    junk = JUNK_KEYS if wild else []
    lines = []
    for key in draw(st.lists(st.sampled_from(list(KEYS[""]) * 10 + junk), min_size=1, max_size=5, unique=True)):
        section = "path_group" if key == "path_groups" else key
        if section in KEYS and section and (not wild or draw(st.integers(0, 4))):
            inner = []
            for k in draw(st.lists(st.sampled_from(list(KEYS[section]) * 10 + junk), max_size=4, unique=True)):
                v = draw(yaml_values(k, 1, wild))
                if k == "dims" and draw(st.booleans()):
                    v = _flow([f"{d}: {draw(st.sampled_from(INTEGERS))}" for d in
                               draw(st.lists(st.sampled_from(["batch", "batch", "seq", "past", "bogus_dim"]),
                                             max_size=2, unique=True))], True)
                inner.append(f"{k}: {v}")
            value = _flow(inner, True)
            if key == "path_groups":
                value = _flow([f"{draw(st.sampled_from(['decode', 'default', 'g']))}: {value}"], True)
        else:
            value = draw(yaml_values(key, 0, wild))
        lines.append(f"{key}: {value}")
    return "\n".join(lines) + "\n"


def _batch_netlist():
    """x[batch, 16] -> MatMul -> Relu -> y, read once (module cache)."""
    if not _NETLIST:
        with tempfile.TemporaryDirectory() as tmp:
            w = onnx.numpy_helper.from_array(np.ones((16, 16), np.float32), "W")
            nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
            graph = helper.make_graph(nodes, "bm",
                                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w])
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10),
                      Path(tmp) / "bm.onnx")
            _NETLIST.append(read_design(str(Path(tmp) / "bm.onnx"), progress=False))
    return _NETLIST[0]


_NETLIST: list = []


@settings(FUZZ, max_examples=150)
@given(constraints_texts())
def test_any_constraints_file_loads_or_is_refused_in_one_line(text):
    """parse_constraints, then the analysis of a one-dim design under them and its strict JSON: only a one-line
    ConstraintsError naming the file (or a SoftsynError from the design, one line) may come out."""
    with deadline():
        try:
            constraints = parse_constraints(text, source="fuzz.yaml")
        except ConstraintsError as exc:
            assert len(str(exc).splitlines()) == 1 and str(exc).startswith("fuzz.yaml:"), exc
            assert len(str(exc)) < 600, exc
            event("refused: " + str(exc).split(": ", 2)[-1][:30])
            return
        try:
            analysis = Design(_batch_netlist(), constraints, LIBRARY, progress=False).analyze()
        except SoftsynError as exc:
            assert len(str(exc).splitlines()) == 1, exc
            event("design refused: " + str(exc).split(": ", 3)[-1][:30])
            return
        event("timed")
        json.loads(to_json(analysis), parse_constant=lambda c: pytest.fail(f"{c} in analysis.json"))


# ------------------------------------------------------------------------------------------ analysis JSON

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8),
              st.floats(allow_nan=True, allow_infinity=True)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)


# edge values first (empty containers, zero, signs, infinities, NaN), then any JSON
replacements = st.one_of(st.sampled_from([[], {}, "", 0, -1, 1e308, float("inf"), float("-inf"), float("nan"), None]),
                         json_values)


def _saved_analysis() -> dict:
    """A real analysis.json: a two-node graph analysed once (module cache)."""
    if not _SAVED:
        with tempfile.TemporaryDirectory() as tmp:
            nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"], name="neg")]
            graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
            path = Path(tmp) / "g.onnx"
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
            code, err = softsyn("analyze", path, "-q", "-o", Path(tmp) / "out")
            assert code == 0, err
            _SAVED.append(json.loads((Path(tmp) / "out" / "analysis.json").read_text()))
    return json.loads(json.dumps(_SAVED[0]))


_SAVED: list[dict] = []


def _locations(node, found=None) -> list[tuple[object, object]]:
    """Every (container, key) of a JSON tree."""
    found = [] if found is None else found
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found.append((node, key))
        _locations(child, found)
    return found


@FUZZ
@given(st.data())
def test_a_mutated_analysis_json_gets_a_documented_answer(data):
    """One mutation anywhere in a real analysis.json (a container emptied, a key deleted, a value replaced,
    or the whole document); every report answers 0 or 2."""
    analysis = _saved_analysis()
    where = _locations(analysis)
    mutation = data.draw(st.sampled_from(["empty", "delete", "replace", "replace", "document"]))
    if mutation == "empty":
        parent, key = data.draw(st.sampled_from([(p, k) for p, k in where if isinstance(p[k], (list, dict))]))
        parent[key] = type(parent[key])()
    elif mutation == "delete":
        parent, key = data.draw(st.sampled_from([(p, k) for p, k in where if isinstance(p, dict)]))
        del parent[key]
    elif mutation == "replace":
        parent, key = data.draw(st.sampled_from(where))
        parent[key] = data.draw(replacements)
    else:
        analysis = data.draw(replacements)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "analysis.json").write_text(json.dumps(analysis))
        codes = set()
        for kind in ("timing", "qor", "area", "constraint", "json"):
            code, err = softsyn("report", kind, tmp)
            assert_documented(code, err)
            codes.add(code)
        event(f"exit {sorted(codes)}")
