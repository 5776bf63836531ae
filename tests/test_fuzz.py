"""Property-based fuzzing (issue 12) with hypothesis: the ONNX frontend and the analysis-JSON reader.

Whatever the input, softsyn times it or refuses it with a SoftsynError (the CLI: exit 0/1, or 2 with one
line), never an internal error (exit 3, a traceback) or a hang; each example runs under an alarm. The
example budgets are fixed and the runs derandomized, so the suite is reproducible and takes ~30 s.
"""
from __future__ import annotations

import contextlib
import io
import json
import signal
import tempfile
from pathlib import Path

import onnx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from softsyn.cli import run
from softsyn.constraints.model import Constraints
from softsyn.design import Design
from softsyn.errors import SoftsynError
from softsyn.frontends import read_design
from softsyn.library import load_library
from softsyn.reports import REPORTS, from_json, to_json

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
    # in a temp folder: ORT's SymbolicShapeInference (Netlist.bind) saves sym_shape_infer_temp.onnx into the cwd
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


def test_garbage_is_not_an_onnx_model(tmp_path):
    for name, data in (("empty.onnx", b""), ("text.onnx", b"not a model"), ("cut.onnx", b"\x08\x0a\x12\xff")):
        (tmp_path / name).write_bytes(data)
        code, err = softsyn("analyze", tmp_path / name, "-q")
        assert_documented(code, err)
        assert code == 2 and ("cannot load ONNX model" in err or "the graph has no outputs" in err), err


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
