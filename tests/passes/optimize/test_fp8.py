"""fp8 (e4m3) weight-only cells: the quantiser, the MatMulBlockQuantizedFp8Weight the map writes (with weights and
weightless), its CPU view against the op's formula, the library cell's recipe, and the option the loop offers."""
import dataclasses

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest

from paths import ROOT
from softsyn.library import load_library
from softsyn.netlist import Netlist
from passes.optimize import mapping as mp
from softsyn.timing.cost import node_work, precision_of

FP8 = ir.DataType.FLOAT8E4M3FN


def test_the_quantiser_round_trips_within_half_an_e4m3_step():
    """Per block of 128 along K: scale = amax / 448 (the block's largest value lands on 448), every value within half
    an e4m3 step (2^-4 relative; an absolute 2^-10 scale below the normal range), no NaN; an all-zero block stays 0
    and a K that is not a multiple of the block keeps its short last block."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 300)) * 0.02).astype(np.float32)
    w[1, :128] = 0.0  # an all-zero block
    w[2, 5] = 3.0  # an outlier: its block's scale, the others' untouched
    q, scales = mp.fp8_blocks(w)
    assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == (6, 300) and scales.shape == (6, 3)
    assert scales.dtype == np.float32 and scales[1, 0] == 1.0 and not np.isnan(q.astype(np.float32)).any()
    blocks = np.zeros((6, 384), np.float32)
    blocks[:, :300] = np.abs(w)
    amax = blocks.reshape(6, 3, 128).max(axis=2)
    nonzero = amax > 0
    np.testing.assert_allclose(scales[nonzero], amax[nonzero] / 448.0, rtol=1e-6)
    assert np.abs(q.astype(np.float32)).max() == 448.0
    back = mp.fp8_dequantised(q, scales)
    step = np.maximum(np.abs(w) * 2.0 ** -4, np.repeat(scales, 128, axis=1)[:, :300] * 2.0 ** -10)
    assert (np.abs(back - w) <= step * (1 + 1e-6)).all()
    assert (back[1, :128] == 0).all() and back[2, 5] == pytest.approx(3.0)
    # saturating: a value past the range of its block's scale clips to 448, never NaN (ml_dtypes' plain cast)
    assert float(np.clip(np.float32(500.0), -448, 448).astype(ml_dtypes.float8_e4m3fn)) == 448.0


def _tiny(k: int, n: int, weight: np.ndarray | None, act=ir.DataType.FLOAT16, transposed: bool = False) -> Netlist:
    """x [batch, 1, k] @ W [k, n] -> y, W an initializer (or Transpose of one; weightless without `weight`)."""
    x = ir.Value(name="x", shape=ir.Shape(["batch", 1, k]), type=ir.TensorType(act))
    shape = [n, k] if transposed else [k, n]
    if weight is None:
        tensor = ir.ExternalTensor(location=mp.WEIGHTLESS, offset=0, length=k * n * 2, dtype=act,
                                   shape=ir.Shape(shape), name="proj.weight")
    else:
        tensor = ir.tensor(weight.T.copy() if transposed else weight, name="proj.weight")
    w = ir.Value(name="proj.weight", shape=ir.Shape(shape), type=ir.TensorType(act), const_value=tensor)
    nodes, src = [], w
    if transposed:
        t = ir.node("Transpose", [w], attributes={"perm": [1, 0]}, name="t")
        t.outputs[0].shape, t.outputs[0].dtype = ir.Shape([k, n]), act
        nodes, src = [t], t.outputs[0]
    mm = ir.node("MatMul", [x, src], name="proj")
    y = mm.outputs[0]
    y.name, y.shape, y.dtype = "y", ir.Shape(["batch", 1, n]), act
    graph = ir.Graph([x], [y], nodes=[*nodes, mm], initializers=[w], opset_imports={"": 18}, name="g")
    return Netlist(ir.Model(graph, ir_version=10), "g")


def test_the_mapped_fp8_cell_is_the_op_and_its_cpu_view_computes_the_op_s_formula(tmp_path):
    """apply_mapping writes com.microsoft.MatMulBlockQuantizedFp8Weight (B [N, K] e4m3fn, b_scale fp32 [N, K/128],
    block_size 128) under the MatMul's name; ORT's CPU provider has no kernel for it, and the CPU view (verify, run)
    computes y = x @ (fp8(B) * b_scale)^T: equal to the numpy reference of the dequantised weight, and within fp8's
    error of the fp16 MatMul it replaced. K = 320 is not a multiple of the block (a short last block)."""
    from softsyn.flow.cpu_view import cpu_view_session
    from softsyn.runtime.session import open_model

    k, n = 320, 96
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((k, n)) * 0.05).astype(np.float16)
    netlist = _tiny(k, n, weight, transposed=True)
    assert mp.apply_mapping(netlist, {"proj": "fp8"}, {"proj": "fp8"}) == {"fp8": 1}
    (node,) = list(netlist.model.graph)
    assert (node.op_type, node.domain, node.name) == (mp.FP8_OP, "com.microsoft", "proj")
    assert node.attributes.get_int("block_size") == mp.FP8_BLOCK == 128 and precision_of(node) == "fp8"
    b, scales = node.inputs[1], node.inputs[2]
    assert list(b.shape) == [n, k] and b.dtype == FP8
    assert list(scales.shape) == [n, 3] and scales.dtype == ir.DataType.FLOAT
    assert node.metadata_props[mp.REQUESTED_KEY] == "fp8" and "proj.weight" not in netlist.model.graph.initializers
    q, s = mp.fp8_blocks(weight.T.astype(np.float32))
    np.testing.assert_array_equal(b.const_value.numpy().view(np.uint8), q.view(np.uint8))
    work = node_work(node, netlist.bind({"batch": 2}))
    assert work.sizes == {"m": 2, "n": n, "k": k, "block": 128}
    assert work.bytes == 2 * k * 2 + n * k + n * 3 * 4 + 2 * n * 2  # A, 1 B per weight, fp32 scales, Y

    path = tmp_path / "model.onnx"
    onnx.save(ir.to_proto(netlist.model), str(path))
    with pytest.raises(Exception, match="MatMulBlockQuantizedFp8Weight"):  # no CPU kernel: its fp16 fallback is refused
        open_model(path, "cpu")
    session, changed = cpu_view_session(path)
    assert changed == {"gqa": 0, "fp8": 1, "bf16": 0}
    x = rng.standard_normal((2, 1, k)).astype(np.float16)
    (y,) = session.run(None, {"x": x})
    reference = x.astype(np.float32) @ mp.fp8_dequantised(q, s).astype(np.float16).astype(np.float32).T
    assert y.dtype == np.float16 and y.shape == (2, 1, n)
    np.testing.assert_allclose(y.astype(np.float32), reference, rtol=2e-3, atol=2e-3 * np.abs(reference).max())
    exact = x.astype(np.float32) @ weight.astype(np.float32)
    assert 0 < np.abs(y - exact).max() / np.abs(exact).max() < 0.05


def test_the_cpu_view_adds_the_bias_and_keeps_a_w8a8_node():
    """The view's Add for the op's optional bias; a node with a_scale (W8A8: activations rounded to fp8 too) is left as
    it is, for the CPU session to refuse by name."""
    from softsyn.runtime.fp8_view import expand_fp8_matmuls
    from softsyn.runtime.session import open_session

    rng = np.random.default_rng(2)
    q, s = mp.fp8_blocks(rng.standard_normal((16, 64)).astype(np.float32), block=32)
    bias = rng.standard_normal(16).astype(np.float16)
    inits = [onnx.numpy_helper.from_array(q, "B"), onnx.numpy_helper.from_array(s, "S"),
             onnx.numpy_helper.from_array(bias, "bias"), onnx.numpy_helper.from_array(np.float32(0.5), "a_scale")]
    nodes = [onnx.helper.make_node(mp.FP8_OP, ["a", "B", "S", "", "bias"], ["y"], name="f", domain="com.microsoft",
                                   block_size=32),
             onnx.helper.make_node(mp.FP8_OP, ["a", "B", "S", "a_scale"], ["z"], name="w8a8", domain="com.microsoft",
                                   block_size=32)]
    io = [onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT16, [3, d])
          for v, d in (("a", 64), ("y", 16), ("z", 16))]
    opsets = [onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid("com.microsoft", 1)]
    model = onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", io[:1], io[1:], inits), ir_version=10,
                                   opset_imports=opsets)
    assert expand_fp8_matmuls(model) == 1
    assert [n.op_type for n in model.graph.node].count(mp.FP8_OP) == 1
    del model.graph.output[1], model.graph.node[-1]  # the W8A8 node out: the rest runs on the CPU
    a = rng.standard_normal((3, 64)).astype(np.float16)
    (y,) = open_session(model).run(None, {"a": a})
    want = a.astype(np.float32) @ mp.fp8_dequantised(q, s, 32).astype(np.float16).astype(np.float32).T + bias
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_a_weightless_plan_maps_to_a_weightless_fp8_cell():
    """A plan's weight is never read: the fp8 cell gets weightless B and b_scale of the quantiser's shapes and dtypes,
    which the area counts (and its what-if at fp8 uses) at 1 B per weight plus an fp32 scale per 128."""
    netlist = _tiny(256, 512, None, transposed=True)
    assert mp.apply_mapping(netlist, {"proj": "fp8"}) == {"fp8": 1}
    (node,) = list(netlist.model.graph)
    assert node.op_type == mp.FP8_OP and node.attributes.get_int("block_size") == 128
    b, scales = node.inputs[1], node.inputs[2]
    assert list(b.shape) == [512, 256] and b.dtype == FP8 and mp.is_weightless(b)
    assert list(scales.shape) == [512, 2] and scales.dtype == ir.DataType.FLOAT and mp.is_weightless(scales)
    assert b.const_value.nbytes == 512 * 256 and scales.const_value.nbytes == 512 * 2 * 4
    cand = mp.Candidate("proj", "", 256, 512, "fp16", ("fp16", "fp8"), 256 * 512)
    assert cand.weight_bytes("fp8", 2) == b.const_value.nbytes + scales.const_value.nbytes
    from softsyn.timing.area import WEIGHT_BYTES, weight_items, weight_options

    kinds, _, params = weight_items(netlist)  # the area counts the cell's real tensors: e4m3 and fp32 scales,
    # both the fp8 weight's storage (labelled by the cell that reads them, softsyn.timing.realised), N x K parameters
    assert {k.name: k.bytes for k in kinds} == {"weights fp8": 512 * 256 + 512 * 2 * 4}
    assert params == 512 * 256
    assert WEIGHT_BYTES["fp8"] == (b.const_value.nbytes + scales.const_value.nbytes) / (512 * 256)
    fp16 = weight_items(_tiny(256, 512, None, transposed=True))[0]
    want = {"fp16": 512 * 256 * 2, "fp8": 512 * 256 * WEIGHT_BYTES["fp8"]}
    assert dict(weight_options(fp16, ["fp16", "fp8"])) == want


def test_the_recipe_builds_a_checked_graph_of_the_op_ort_resolves():
    """The library cell's graph (eager and, at one row, the graph table's): onnx.checker passes it and ORT resolves the
    node against its own schema (types, arity), stopping only at the kernel lookup the CPU provider cannot serve."""
    import onnxruntime as ort

    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx, make_model
    from softsyn.characterize.plan import GRAPH_ROWS, graph_grids

    kind = next(k for k in cell_kinds() if k.key == "MatMulBlockQuantizedFp8Weight.fp8")
    assert kind.providers == ("cuda",) and kind.axes == ["m", "n", "k", "block"] and kind.discrete == ("block",)
    assert GRAPH_ROWS[kind.op] == "m" and graph_grids(kind, kind.grids["cuda"])[0] == [1, 16]
    assert mp.FP8_BLOCK in kind.grids["cuda"][3]
    ctx = Ctx(provider="cuda", row=1024, head_dim=128, act="fp16")
    for m in (4, 1):  # an eager point, and the graph table's one row
        sizes = {"m": m, "n": 256, "k": 320, "block": 128}
        model = make_model(kind.build(sizes, 2, ctx))
        for out in model.graph.output:  # the recipes leave output shapes to ORT; the checker wants one
            out.type.tensor_type.shape.dim.add().dim_value = m
            out.type.tensor_type.shape.dim.add().dim_value = 256
        onnx.checker.check_model(model, full_check=True)
        b = next(t for t in model.graph.initializer if t.name == "B0")
        s = next(t for t in model.graph.initializer if t.name == "S0")
        assert (b.data_type, list(b.dims), s.data_type, list(s.dims)) == (17, [256, 320], 1, [256, 3])
        with pytest.raises(Exception, match="InsertedPrecisionFreeCast_a.*MatMulBlockQuantizedFp8Weight"):
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    external = {}  # the CUDA plan's shared weights: B as its bytes, typed float8e4m3fn
    make_model(kind.build(sizes, 2, ctx), external)
    assert external["B0"][0] == onnx.TensorProto.FLOAT8E4M3FN and external["B0"][1].shape == (256, 320)


def _with_fp8_cell(library):
    """A copy of the library whose only fp8 cells are the int8 MatMulNBits tables relabelled (a stand-in, not
    measured: the decision below does not hang on the H200's own fp8 figures)."""
    fake = [dataclasses.replace(c, op=mp.FP8_OP, precision="fp8") for c in library.cells
            if c.op == "MatMulNBits" and c.precision == "int8"]
    assert fake
    return dataclasses.replace(library, cells=[*_without_fp8_cell(library).cells, *fake])


def _without_fp8_cell(library):
    """A copy of the library with no fp8 weight cell (as a library characterised before the cell existed)."""
    return dataclasses.replace(library, cells=[c for c in library.cells if c.op != mp.FP8_OP])


CONS = """target: h200-ort-cuda
workload: {batch: 1, prompt_len: 8, context_len: 16}
path_groups:
  decode: {kind: decode, clock_period: 1ms, dims: {batch: 1}}
precision: {allowed: [fp16, ALLOWED], default: fp16}
"""


@pytest.mark.parametrize("allowed, cell, offered, why", [
    ("fp8", True, True, None),
    ("fp8", False, False, "has no MatMulBlockQuantizedFp8Weight.fp8 cell"),
    ("int8", True, False, "fp8 is not in precision.allowed")])
def test_fp8_is_offered_where_allowed_and_characterised_else_skipped_with_a_reason(allowed, cell, offered, why):
    from softsyn.constraints import parse_constraints
    from softsyn.design import Design

    library = load_library("h200-ort-cuda")
    design = Design(_tiny(256, 512, None), parse_constraints(CONS.replace("ALLOWED", allowed)),
                    _with_fp8_cell(library) if cell else _without_fp8_cell(library), progress=False)
    (cand,), skipped = mp.candidates(design)
    assert ("fp8" in cand.options) == offered and (why is None) == ("fp8" not in skipped)
    if why:
        assert why in skipped["fp8"]
        import passes

        passes.run_pass(design, "optimize", {})  # the loop's report says why fp8 was not offered
        assert any(note.startswith("fp8: ") and why in note for note in design.pass_reports["optimize"].notes)
    if offered:
        tables = mp.delay_tables(design, [cand])["decode"]["proj"]
        assert set(tables) == {"fp16", "fp8"} and tables["fp8"] > 0
        assert cand.weight_bytes("fp8", 2) == 256 * 512 + 512 * 2 * 4 < cand.weight_bytes("fp16", 2)
    fp32 = Design(_tiny(256, 512, None, act=ir.DataType.FLOAT), parse_constraints(CONS.replace("ALLOWED", allowed)
                  .replace("fp16", "fp32")), _with_fp8_cell(library), progress=False)
    (cand32,), skipped32 = mp.candidates(fp32)
    assert "fp8" not in cand32.options
    if allowed == "fp8":
        assert "activations other than fp16/bf16" in skipped32["fp8"]


def test_the_fp16_pass_keeps_an_fp8_cell_s_scales_fp32():
    """A design that already holds fp8 cells (an fp8 checkpoint's export, a compiled artifact read back): its fp32
    activations go fp16, the scales stay fp32 as the op's schema wants, and the CPU view runs the result."""
    from passes.precision.fp16 import to_fp16
    from softsyn.runtime.fp8_view import expand_fp8_matmuls
    from softsyn.runtime.session import open_session

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((128, 32)).astype(np.float32)
    netlist = _tiny(128, 32, weight, act=ir.DataType.FLOAT)
    mp.apply_mapping(netlist, {"proj": "fp8"})
    result = to_fp16(netlist.model)
    (node,) = [n for n in netlist.model.graph if n.op_type == mp.FP8_OP]
    assert node.inputs[0].dtype == ir.DataType.FLOAT16 and node.inputs[2].dtype == ir.DataType.FLOAT
    assert result.weights == 0 and node.inputs[1].dtype == FP8
    proto = ir.to_proto(netlist.model)
    assert expand_fp8_matmuls(proto) == 1
    x = rng.standard_normal((1, 1, 128)).astype(np.float16)
    (y,) = open_session(proto).run(None, {"x": x})
    q, s = mp.fp8_blocks(weight.T)
    want = x.astype(np.float32) @ mp.fp8_dequantised(q, s).astype(np.float16).astype(np.float32).T
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_an_fp8_map_compiles_for_cuda_and_verifies_on_the_cpu_view(cache_dir, tmp_path):
    """compile --effort medium with fp8 allowed against a library holding the fp8 cell (a stand-in copy of the shipped
    H200 library: MatMulNBits.int4's tables at half the delay under the fp8 cell's name, so the loop picks fp8): the
    artifact is written on this GPU-less machine (its CPU view loads), netlist.json and session.json say fp8 requested
    and realised, and verify runs it through the CPU view within the budget."""
    import json

    import yaml
    from click.testing import CliRunner

    from softsyn.cli import main

    lib = yaml.safe_load((ROOT / "softsyn/library/libs/h200-ort-cuda.yaml").read_text())

    def half(x):
        return [half(v) for v in x] if isinstance(x, list) else x * 0.5

    stand_in = [dict(c, op=mp.FP8_OP, precision="fp8", delays=half(c["delays"]), notes="stand-in, not measured")
                for c in lib["cells"] if c["op"] == "MatMulNBits" and str(c["precision"]) == "int4"]
    lib["cells"] = [c for c in lib["cells"] if c["op"] != mp.FP8_OP]  # the stand-in alone, whatever the H200 measured
    lib["cells"] += [{k: v for k, v in c.items() if k != "holdout"} for c in stand_in]
    (tmp_path / "lib.yaml").write_text(yaml.safe_dump(lib, sort_keys=False))
    (tmp_path / "c.yaml").write_text(
        f"target: {tmp_path / 'lib.yaml'}\nworkload: {{batch: 1, prompt_len: 32, context_len: 64}}\npath_groups:\n"
        "  prefill: {kind: prefill, clock_period: 100ms, dims: {batch: 1, seq: 32, past: 0}}\n"
        "  decode: {kind: decode, clock_period: 10us, dims: {batch: 1, seq: 1, past: 64}}\n"
        "accuracy: {max_rel_error: 50%}\nprecision: {allowed: [fp16, fp8], default: fp16}\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-tiny", "-c", str(tmp_path / "c.yaml"), "--effort",
                                       "medium", "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code in (0, 1), result.output + repr(result.exception)  # 1: decode's 10 us is not met
    cells = [c for c in json.loads((out / "netlist.json").read_text())["cells"] if c["op"] == mp.FP8_OP]
    assert cells and all(c["cell"] == "MatMulBlockQuantizedFp8Weight.fp8" and c["precision"] == "fp8"
                         and c["requested_precision"] == "fp8" for c in cells)
    session = json.loads((out / "runtime" / "session.json").read_text())
    assert session["precision_map"]["realised"] == {"fp8": len(cells)} == session["precision_map"]["requested"]
    assert "fp8" in (out / "reports" / "precision.rpt").read_text()
    verify = CliRunner().invoke(main, ["verify", str(out), "--cpu"])
    assert verify.exit_code == 0, verify.output + repr(verify.exception)
    assert f"{len(cells)} fp8 weight MatMuls decoded to MatMul" in verify.output
