"""`softsyn characterize`: a quick CPU run of a cell subset writes a valid, resumable library whose
tables the timing uses; cost.py's size axes are the tables' axes; the header carries the measured
hold-out interpolation error."""
from __future__ import annotations


import onnx_ir as ir
import pytest
import yaml
from click.testing import CliRunner

from softsyn.cli import main
from softsyn.library import load_library
from softsyn.timing import node_work, precision_of


# Weight bytes in one MatMul cell graph for the module's runs: 8 MiB, not the plan's 64 MiB (the cell's cold-weight
# rule, test_weight_cells_cycle_their_weights_past_the_cache, at the plan's own cap): the graphs stay on that rule's
# path at every quick grid point (4 MiB of weights at the largest) and the library takes a third of the time.
TEST_WEIGHT_CAP = 8 << 20


@pytest.fixture(scope="module")
def quick_lib(tmp_path_factory):
    """A --quick CPU library of the cells the tests read (the fp32 MatMul tables, Add, Softmax, Run) and the fp16
    MatMuls the provider does not compute (recorded as not characterised), measured with TEST_WEIGHT_CAP."""
    from dataclasses import replace

    from softsyn.characterize.runner import SETTINGS

    path = tmp_path_factory.mktemp("char") / "lib.yaml"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(SETTINGS, "cpu-quick", replace(SETTINGS["cpu-quick"], weight_cap=TEST_WEIGHT_CAP))
        result = CliRunner().invoke(main, ["characterize", "--provider", "cpu", "--quick", "--cells",
                                           "MatMul.fp32,MatMul.fp32.batched,MatMul.fp16*,Add,Softmax,Run", "-o",
                                           str(path), "-q"])
    assert result.exit_code == 0, result.output
    return path


def test_quick_run_writes_a_valid_library_with_tables(quick_lib):
    lib = load_library(quick_lib)
    names = {c.name for c in lib.cells}
    assert {"MatMul.fp32.ort-cpu", "MatMul.fp32.ort-cpu-batched", "Add.fp32.ort-cpu", "Softmax.fp32.ort-cpu",
            "Run.fp32.ort-cpu"} <= names
    d, src = lib.delay("MatMul", "fp32", 2 * 16 * 256 * 256, 0, {"m": 16, "n": 256, "k": 256})
    assert src == "table" and 1e-8 < d < 1e-2
    d, src = lib.delay("Add", "fp32", 1000, 8000, {"elements": 1000})
    assert src == "table" and d > 0
    assert lib.delay("Add", "fp32", 1, 8, {"elements": 1 << 30})[1] == "table-extrap"
    assert lib.delay("Erf", "fp32", 1, 8, {"elements": 10})[1] == "est"  # not characterised here
    assert lib.run_delay(12)[1] == "table"


def test_holdout_error_in_header_and_cells(quick_lib):
    data = yaml.safe_load(quick_lib.read_text())
    err = data["interpolation_error"]
    assert err["points"] > 0 and err["median_pct"] is not None and err["max_pct"] >= err["median_pct"]
    mm = next(c for c in data["cells"] if c["op"] == "MatMul" and c["implementation"] == "ort-cpu")
    h = mm["holdout"]
    assert len(h["points"]) == len(h["measured"]) == len(h["interpolated"]) > 0
    assert all(len(p) == 3 for p in h["points"])
    # fp16/bf16 MatMul do not compute natively on ORT CPU: recorded as not characterised, with the reason
    assert any(k.startswith("MatMul.fp16") for k in data["not_characterised"])
    assert data["characterization"]["plan"] == "cpu-quick"


def test_resume_skips_measured_cells(quick_lib):
    before = quick_lib.read_text()
    result = CliRunner().invoke(main, ["characterize", "--provider", "cpu", "--quick", "--cells", "MatMul.fp32,Add",
                                       "-o", str(quick_lib)])
    assert result.exit_code == 0, result.output
    assert "already in" in result.output and "skipped" in result.output
    after = yaml.safe_load(quick_lib.read_text())
    assert [c["delays"] for c in after["cells"]] == [c["delays"] for c in yaml.safe_load(before)["cells"]]


def test_again_measures_the_named_cells_once_more_and_replaces_them(quick_lib, tmp_path, capsys):
    """--again: a recipe changed, so the cells named are measured though the file has them; the others stay as they
    were, and --again without --cells is refused (exit 2)."""
    import shutil

    path = tmp_path / "lib.yaml"
    shutil.copy(quick_lib, path)
    before = {c["op"] + "." + c["implementation"]: c for c in yaml.safe_load(path.read_text())["cells"]}
    result = CliRunner().invoke(main, ["characterize", "--provider", "cpu", "--quick", "--cells", "Add", "--again",
                                       "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert "Add.fp32.ort-cpu: already in" not in result.output
    after = {c["op"] + "." + c["implementation"]: c for c in yaml.safe_load(path.read_text())["cells"]}
    assert after.keys() == before.keys()
    assert after["Add.ort-cpu"]["holdout"]["measured"] != before["Add.ort-cpu"]["holdout"]["measured"]
    assert after["Softmax.ort-cpu"] == before["Softmax.ort-cpu"]
    from softsyn.cli import run

    with pytest.raises(SystemExit) as refused:
        run(["characterize", "--provider", "cpu", "--again", "-o", str(path)])
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and err.endswith("name them with --cells") and "\n" not in err


def test_a_resumed_run_keeps_the_library_s_command(quick_lib, tmp_path):
    """The command that started a library stays its `command`; a resumed run with other cells is listed after it."""
    import shutil

    from softsyn.characterize.plan import characterize

    path = tmp_path / "lib.yaml"
    shutil.copy(quick_lib, path)
    first = yaml.safe_load(path.read_text())["command"]
    characterize("cpu", path, cells="Neg", quick=True, progress=False, command="softsyn characterize --cells Neg")
    after = yaml.safe_load(path.read_text())
    assert after["command"] == first
    assert after["characterization"]["resumed_with"] == ["softsyn characterize --cells Neg"]


def test_a_library_measured_on_another_device_is_not_resumed(quick_lib, tmp_path, capsys):
    """A library's header names the one device its cells were measured on: resuming it on another machine (an H200
    library on an H100, a Xeon's on an EPYC) is refused with exit 2 and the file is left as it was."""
    from softsyn.cli import run

    path = tmp_path / "lib.yaml"
    data = yaml.safe_load(quick_lib.read_text())
    data["device"] = "Some Other CPU @ 1.00GHz, 64 cores (avx2)"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    before = path.read_text()
    with pytest.raises(SystemExit) as refused:
        run(["characterize", "--provider", "cpu", "--quick", "--cells", "Neg", "-o", str(path)])
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and "\n" not in err
    assert f"{path}: was measured on Some Other CPU @ 1.00GHz, this machine is " in err
    assert err.endswith("characterize into a new -o FILE") and path.read_text() == before


def test_design_timing_uses_table_delays(quick_lib):
    """A netlist's MatMul and Add get (table) delays from the characterised library."""
    from softsyn.timing import cell_timings

    x = ir.Value(name="x", shape=ir.Shape([4, 64]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([64, 128]), type=ir.TensorType(ir.DataType.FLOAT),
                 const_value=ir.tensor(__import__("numpy").zeros((64, 128), "float32"), name="w"))
    mm = ir.node("MatMul", [x, w], name="mm")
    mm.outputs[0].name, mm.outputs[0].shape, mm.outputs[0].dtype = "y", ir.Shape([4, 128]), ir.DataType.FLOAT
    add = ir.node("Add", [mm.outputs[0], mm.outputs[0]], name="add")
    add.outputs[0].name, add.outputs[0].shape, add.outputs[0].dtype = "z", ir.Shape([4, 128]), ir.DataType.FLOAT
    graph = ir.Graph([x], [add.outputs[0]], nodes=[mm, add], initializers=[w], opset_imports={"": 17})

    class _Netlist:
        def nodes(self):
            return list(graph)

    assert node_work(mm, {}).sizes == {"m": 4, "n": 128, "k": 64}
    assert precision_of(mm) == "fp32"
    timings = cell_timings(_Netlist(), load_library(quick_lib), {})
    assert [t.source for t in timings] == ["table", "table"]


def test_cost_size_axes_match_cell_axes():
    """Every characterised cell's axes are what cost.node_work reports for that op."""
    from softsyn.characterize.catalogue import cell_kinds

    for kind in cell_kinds():
        if kind.op in ("MatMul", "Gemm", "MatMulNBits", "GroupQueryAttention", "MultiHeadAttention", "MoE", "QMoE",
                       "MatMulBlockQuantizedFp8Weight"):
            continue  # checked by the explicit shapes below (MoE/QMoE: test_moe.py; fp8: test_fp8.py, in tests/passes/)
        assert kind.axes == ["elements"], kind.key
    f = ir.DataType.FLOAT
    q = ir.Value(name="q", shape=ir.Shape([1, 8, 4 * 32]), type=ir.TensorType(f))
    k = ir.Value(name="k", shape=ir.Shape([1, 8, 2 * 32]), type=ir.TensorType(f))
    gqa = ir.node("GroupQueryAttention", [q, k, k], attributes={"num_heads": 4, "kv_num_heads": 2},
                  domain="com.microsoft", num_outputs=3)
    gqa.outputs[1].shape = ir.Shape([1, 2, 40, 32])
    sizes = node_work(gqa, {}).sizes
    assert sizes == {"batch": 1, "q_tokens": 8, "kv_len": 40, "heads": 4, "kv_heads": 2, "head_dim": 32}
    gqa_kind = next(c for c in cell_kinds() if c.op == "GroupQueryAttention")
    assert set(gqa_kind.axes) <= set(sizes) and set(gqa_kind.scale) <= set(sizes)
    a = ir.Value(name="a", shape=ir.Shape([3, 256]), type=ir.TensorType(f))
    b = ir.Value(name="b", shape=ir.Shape([64, 8, 16]), type=ir.TensorType(ir.DataType.UINT8))
    nb = ir.node("MatMulNBits", [a, b], attributes={"K": 256, "N": 64, "bits": 4, "block_size": 32},
                 domain="com.microsoft")
    nb.outputs[0].shape, nb.outputs[0].dtype = ir.Shape([3, 64]), f
    w = node_work(nb, {})
    assert w.sizes == {"m": 3, "n": 64, "k": 256, "block": 32} and precision_of(nb) == "int4"
    assert w.bytes < 3 * 256 * 4 + 64 * 256 * 4  # int4 weights: far fewer bytes than fp32


def test_cli_help():
    result = CliRunner().invoke(main, ["characterize", "--help"])
    assert result.exit_code == 0
    for word in ("--provider", "--cells", "--quick", "--list", "Resumable", "hold-out"):
        assert word.lower() in result.output.lower()
    listing = CliRunner().invoke(main, ["characterize", "--list", "--quick", "--provider", "cuda"])
    assert listing.exit_code == 0 and "GroupQueryAttention.fp16.ort-cuda" in listing.output


def test_chain_form_graphs():
    """CPU cells are built in chain form where the op allows it: copy i reads copy i-1's output, one graph
    output; shape-changing ops alternate shapes; view/Transpose chains run without ORT's graph rewrites."""
    import onnxruntime as ort

    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx, make_model

    ctx = Ctx(provider="cpu", row=256, head_dim=32, act="fp32", form="chain")
    kinds = {k.key if not k.variant else k.key: k for k in cell_kinds() if "cpu" in k.providers}

    def run(g):
        so = ort.SessionOptions()
        if not g.optimize:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        s = ort.InferenceSession(make_model(g).SerializeToString(), so, providers=["CPUExecutionProvider"])
        return s.run(None, {n: a for n, (_, a) in g.inputs.items()})

    for key, sizes in (("Mul.fp32", {"elements": 1000}), ("MatMul.fp32", {"m": 8, "n": 64, "k": 32}),
                       ("MatMul.fp32.batched", {"batch": 2, "m": 4, "n": 16, "k": 8}),
                       ("Gemm.fp32", {"m": 8, "n": 64, "k": 32}), ("Reshape.fp32", {"elements": 1024}),
                       ("Unsqueeze.fp32", {"elements": 64}), ("Transpose.fp32", {"elements": 4096}),
                       ("SimplifiedLayerNormalization.fp32", {"elements": 1024})):
        g = kinds[key].build(sizes, 4, ctx)
        assert len(g.outputs) == 1, key
        for prev, node in zip(g.nodes, g.nodes[1:]):
            assert prev.output[0] in node.input, key
        assert len(run(g)) == 1
    assert not kinds["Reshape.fp32"].build({"elements": 1024}, 4, ctx).optimize
    # ops whose output cannot feed their input stay independent copies
    g = kinds["Equal.fp32"].build({"elements": 64}, 4, ctx)
    assert len(g.outputs) == 4
    copies = kinds["MatMul.fp32"].build({"m": 8, "n": 64, "k": 32}, 4, Ctx("cpu", 256, 32, "fp32"))
    assert len(copies.outputs) == 4


def test_outlier_points_are_found_against_larger_points():
    """A point slower than 2x a point at least as large on every axis is a measurement hiccup (re-measured)."""
    from softsyn.characterize.runner import suspects
    # the shipped Cast table of 2026-11-30: 34.9 us at 16 elements between 0.17 us and 0.12 us
    pts = [(1,), (4,), (16,), (64,), (256,)]
    assert suspects(pts, [1.75e-7, 1.7e-7, 3.49e-5, 1.17e-7, 2.19e-7]) == [2]
    assert suspects(pts, [1e-7, 1.1e-7, 1.3e-7, 1.2e-7, 2e-7]) == []  # small wiggles are noise, not outliers
    grid = [(1, 32), (1, 64), (2, 32), (2, 64)]
    assert suspects(grid, [1e-6, 2e-6, 9e-6, 3e-6]) == [2]  # (2, 32) is 3x slower than (2, 64)
    # a discrete axis (block size) is compared only at equal values: larger blocks may be faster
    assert suspects([(1, 32), (1, 128)], [9e-6, 1e-6], discrete=(1,)) == []



def test_a_direct_sample_does_not_beat_the_copies():
    """A pass that fell back on one direct copy timed its weights hot: the copies' marginal cost stands."""
    from softsyn.characterize.runner import Sample, best_delay
    copies = [Sample(70e-6, 70e-6 + 27 * 88e-6, 28), Sample(69e-6, 69e-6 + 27 * 86e-6, 28)]
    direct = Sample(69e-6, direct=True)
    assert best_delay(copies + [direct], 3e-6) == pytest.approx(86e-6, rel=0.02)
    assert best_delay([direct, Sample(72e-6, direct=True)], 3e-6) == pytest.approx(66e-6)


def test_passes_combine_by_the_fastest_or_the_median():
    """CUDA keeps the fastest pass (noise only adds time); the CPU takes the median pass (its VM also has fast
    phases, which the fastest of the passes would make the table's)."""
    from softsyn.characterize.runner import SETTINGS, Sample, best_delay
    fast, typical, busy = (Sample(10e-6, 10e-6 + 63 * d, 64) for d in (1e-6, 2e-6, 5e-6))
    assert best_delay([busy, fast, typical], 0.0) == pytest.approx(1e-6)
    assert best_delay([busy, fast, typical], 0.0, "median") == pytest.approx(2e-6)
    assert best_delay([Sample(3e-3, direct=True), Sample(2e-3, direct=True), Sample(1e-3, direct=True)], 0.0,
                      "median") == pytest.approx(2e-3)
    assert SETTINGS["cpu"].combine == "median" and SETTINGS["cpu"].passes >= 3
    assert SETTINGS["cuda"].combine == "fastest"


def test_weight_cells_cycle_their_weights_past_the_cache():
    """CPU weight cells take as many copies as weight_cap holds (cold weights, as in a model larger than the L3),
    whatever their run time; cells without weights keep the run-time rule."""
    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx
    from softsyn.characterize.runner import SETTINGS, graph_bytes, measure_point

    ctx = Ctx(provider="cpu", row=256, head_dim=32, act="fp32", form="chain", precision="fp32")
    kind = next(k for k in cell_kinds() if k.key == "MatMul.fp32" and "cpu" in k.providers)
    sizes = {"m": 16, "n": 1536, "k": 384}  # minilm's FFN: 2.4 MB of weights, ~70 us hot
    cap = SETTINGS["cpu"].weight_cap
    sample = measure_point(kind, sizes, ctx, 3e-6, 0.05, quick=True)
    assert not sample.direct
    assert sample.copies == min(64, cap // graph_bytes(kind.build(sizes, 1, ctx)))
    assert sample.copies * 1536 * 384 * 4 > 32 << 20  # more weight than the L3 holds


def test_one_and_many_copies_share_their_inputs():
    """A point's one-copy and N-copy runners bind the same input arrays once (softsyn.characterize.cellgraph.data memoises)."""
    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx
    from softsyn.characterize.runner import Runner

    ctx = Ctx(provider="cpu", row=256, head_dim=32, act="fp32", form="copies", precision="fp32")
    kind = next(k for k in cell_kinds() if k.key == "Add.fp32")
    g1, g4 = kind.build({"elements": 4096}, 1, ctx), kind.build({"elements": 4096}, 4, ctx)
    assert g1.inputs["a"][1] is g4.inputs["a"][1]
    uploaded: dict = {}
    one, many = Runner(g1, "cpu", uploaded), Runner(g4, "cpu", uploaded)
    one(), many()
    assert len(uploaded) == len(g1.inputs)


def test_settle_waits_for_the_reference_speed_and_says_when_it_gave_up():
    from softsyn.characterize.probe import settle
    readings, waited, ok = settle("cpu", timeout=20, tolerance=10.0)  # any 3 readings agree within 10x
    assert ok and len(readings) == 3 and waited < 20
    readings, waited, ok = settle("cpu", timeout=1.0, reference=1e-9)  # no machine runs the probe in 1 ns
    assert not ok and waited >= 1.0 and len(readings) >= 2


def test_a_cell_measured_in_a_slow_phase_is_measured_again(quick_lib, tmp_path, monkeypatch):
    """Passes are probe-gated: a cell whose every pass started slow against the run's fastest probe is measured again
    at the end of the plan, and the measurement whose passes ran faster stands (one entry per cell)."""
    import softsyn.characterize.plan as ch
    from softsyn.characterize.writer import render_library_yaml

    path = tmp_path / "lib.yaml"  # the quick library's header (measured ceilings), none of its cells
    data = yaml.safe_load(quick_lib.read_text())
    data["cells"] = []
    path.write_text(render_library_yaml(data))
    # Neg's two passes start in a slow phase (3x), Abs's at speed; Neg again at speed
    readings = iter([3e-4, 3e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4])
    monkeypatch.setattr(ch, "speed_probe", lambda provider: next(readings))
    lib = ch.characterize("cpu", path, cells="Neg,Abs", quick=True, progress=False)
    neg = [c for c in lib["cells"] if c["op"] == "Neg"]
    assert len(neg) == 1 and neg[0]["measured"]["pass_probes_us"] == [100, 100]
    assert [c["measured"]["pass_probes_us"] for c in lib["cells"] if c["op"] == "Abs"] == [[100, 100]]


def test_runner_takes_output_shapes_from_an_ort_allocated_run():
    """The path every CUDA runner takes (and any graph whose input has no host data): output shapes from one run with
    outputs allocated by ORT, then preallocated and bound."""
    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx
    from softsyn.characterize.runner import Runner

    ctx = Ctx(provider="cpu", row=256, head_dim=32, act="fp32", form="copies", precision="fp32")
    g = next(k for k in cell_kinds() if k.key == "Add.fp32").build({"elements": 4096}, 2, ctx)
    g.inputs["a"] = (g.inputs["a"][0], tuple(g.inputs["a"][1].shape))  # device-only allocation, no host data
    runner = Runner(g, "cpu")
    runner()
    assert [tuple(v.shape()) for v in runner.binding.get_outputs()] == [(16, 256), (16, 256)]


@pytest.mark.parametrize("key, sizes, precision", [("MatMulNBits.int4", {"m": 4, "n": 256, "k": 256, "block": 32}, "int4"),
                                                   ("DequantizeLinear.fp8", {"elements": 4096}, "fp8"),
                                                   ("Gather.fp32", {"elements": 2048}, "fp32")])
def test_shared_weights_reach_the_session_as_external_initializers(monkeypatch, key, sizes, precision):
    """The CUDA plan's random weights (cells.Blob) are not inlined in the protobuf: every copy's initializer references
    one host array per type and shape, which ORT copies in; the copies compute what inlined copies of that array do."""
    import numpy as np
    from onnx import TensorProto

    from dataclasses import replace

    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Blob, Ctx
    from softsyn.characterize.runner import SETTINGS, Runner

    ctx = Ctx(provider="cpu", row=256, head_dim=32, act="fp32", form="copies", precision=precision)
    kind = next(k for k in cell_kinds() if k.key == key)
    graph = kind.build(sizes, 3, ctx)
    inlined = Runner(graph, "cpu")
    monkeypatch.setitem(SETTINGS, "cpu", replace(SETTINGS["cpu"], shared_weights=True))
    shared = Runner(graph, "cpu")
    blobs = [t.name for t in graph.inits if isinstance(t, Blob)]
    assert len(blobs) >= 3
    by_name = {t.name: t for t in shared.model.graph.initializer}
    assert all(by_name[n].data_location == TensorProto.EXTERNAL and not by_name[n].raw_data for n in blobs)
    assert len(shared.model.SerializeToString()) < 4096 < len(inlined.model.SerializeToString())
    inlined(), shared()
    first = inlined.binding.get_outputs()[0].numpy()
    assert ([o.numpy().shape for o in shared.binding.get_outputs()]
            == [o.numpy().shape for o in inlined.binding.get_outputs()])
    for out in shared.binding.get_outputs()[:3]:  # every copy reads copy 0's weights
        np.testing.assert_array_equal(out.numpy(), first)


def test_cells_that_cannot_chain_run_as_arena_intermediates():
    """On the CPU a copies-form cell keeps only its last node's outputs as graph outputs (the other copies' outputs
    are allocated and freed by ORT's arena, as a model's intermediates are) and runs without graph rewrites (they
    would merge the identical copies); chained cells and CUDA cells are left as they are."""
    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import Ctx
    from softsyn.characterize.runner import Runner, cell_graph

    cpu = Ctx(provider="cpu", row=256, head_dim=32, act="fp32", form="chain", precision="fp32")
    concat = next(k for k in cell_kinds() if k.key == "Concat.fp32")
    g = cell_graph(concat, {"elements": 64}, 4, cpu)
    assert (g.form, g.optimize, [n for n, _ in g.outputs]) == ("intermediates", False, [g.nodes[-1].output[0]])
    assert len(g.nodes) == 4
    runner = Runner(g, "cpu")
    runner()
    assert len(runner.session.get_outputs()) == 1
    add = next(k for k in cell_kinds() if k.key == "Add.fp32")
    assert cell_graph(add, {"elements": 64}, 4, cpu).form == "chain"
    gpu = Ctx(provider="cuda", row=1024, head_dim=128, act="fp16", form="copies", precision="fp32")
    assert cell_graph(concat, {"elements": 64}, 4, gpu).form == "copies"


def test_attention_cells_update_their_kv_buffer_in_place():
    """GroupQueryAttention's cell binds present to past (Graph.aliases), as a compiled artifact binds its shared KV
    buffer: the kernel writes the new position into the one buffer instead of copying the cache into a second one
    (which timed the H200's decode attention at 2x). Each runner owns its aliased buffer (the runs write it)."""
    import numpy as np

    from softsyn.characterize.cellgraph import Ctx
    from softsyn.characterize.recipes import gqa
    from softsyn.characterize.runner import Runner

    ctx = Ctx(provider="cpu", row=256, head_dim=32, act="fp32", form="copies", precision="fp32")
    g = gqa("fp32")({"q_tokens": 1, "kv_len": 64, "heads": 4}, 2, ctx)
    assert g.aliases == {"pk0": "past_key", "pv0": "past_value", "pk1": "past_key", "pv1": "past_value"}
    uploaded: dict = {}
    runner, other = Runner(g, "cpu", uploaded), Runner(g, "cpu", uploaded)
    runner()
    bound = dict(zip([*g.inputs, *(n for n, _ in g.outputs)], runner.keep))
    assert bound["pk0"] is bound["past_key"] and bound["pv1"] is bound["past_value"]
    assert bound["past_key"] is not dict(zip([*g.inputs, *(n for n, _ in g.outputs)], other.keep))["past_key"]
    past = bound["past_key"].numpy()  # the new token's key landed at position kv_len - 1 of the one buffer
    np.testing.assert_allclose(past[0, :, -1, :], g.inputs["key"][1].reshape(2, 32), rtol=1e-6)


def test_graph_tables_cover_a_decode_step_s_small_nodes_at_decode_sizes():
    """A captured decode step's norms and element-wise nodes get graph tables too (they cost 1.7-4 us inside a graph
    on the H200, not an empty node's 1.1 us), over element counts a decode step has; the projections at decode rows (one sequence to a batch of 16)."""
    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.plan import GRAPH_ELEMENTS, graph_grids, graph_kind

    kinds = {k.key: k for k in cell_kinds() if "cuda" in k.providers}
    norm = kinds["SkipSimplifiedLayerNormalization.fp16"]
    assert graph_kind(norm) and graph_grids(norm, norm.grids["cuda"]) == [[1, 1024, 16384, GRAPH_ELEMENTS]]
    mm = kinds["MatMulNBits.int4"]
    assert graph_kind(mm) and graph_grids(mm, mm.grids["cuda"])[0] == [1, 16]  # one sequence, a batch of 16
    assert not graph_kind(kinds["Softmax.fp16"])  # not a node of a fused decode step
    listing = CliRunner().invoke(main, ["characterize", "--provider", "cuda", "--graph", "--list", "--cells",
                                        "SkipSimplifiedLayerNormalization.fp16,MatMulNBits.int4"])
    assert listing.exit_code == 0, listing.output
    assert "SkipSimplifiedLayerNormalization.fp16.ort-cuda-graph     4 grid" in listing.output
    assert "MatMulNBits.int4.ort-cuda-graph" in listing.output and "2 cells" in listing.output


def test_moe_bf16_cell_builds_its_bf16_experts():
    """MoE.bf16 (CUDA only) failed to build with a KeyError: numpy has no bf16 for its expert weights (cells.Blob).
    Its model now holds bf16 experts of two bytes each whose values are the fp32 draw truncated to bf16, inlined
    and as the CUDA plan's shared external initializers alike."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    from softsyn.characterize.catalogue import cell_kinds
    from softsyn.characterize.cellgraph import BF16, Blob, Ctx, make_model, uniform

    ctx = Ctx(provider="cuda", row=256, head_dim=32, act="fp16", form="copies", precision="bf16")
    kind = next(k for k in cell_kinds() if k.key == "MoE.bf16")
    graph = kind.build({"tokens": 4, "experts": 4, "k": 2, "hidden": 64, "inter": 96}, 2, ctx)
    model = make_model(graph)
    fc1 = next(t for t in model.graph.initializer if t.name == "fc1_0")
    blob = next(t for t in graph.inits if isinstance(t, Blob) and t.name == "fc1_0")
    assert fc1.data_type == TensorProto.BFLOAT16 and len(fc1.raw_data) == 2 * 4 * 64 * 64 == blob.nbytes
    values = numpy_helper.to_array(fc1).astype(np.float32)
    draw = uniform(blob.shape, blob.seed) * blob.scale
    assert np.all(values <= draw) and np.allclose(values, draw, rtol=2 ** -7)
    external: dict = {}
    make_model(graph, external)
    elem, array = external["fc1_0"]
    assert elem == BF16 and array.dtype == np.uint16 and array.nbytes == blob.nbytes


def test_moe_hold_outs_lie_on_the_widths_its_cuda_kernels_take():
    """The full CUDA grid's hold-outs sit between grid widths on hidden widths of 128k and expert widths (inter / 3)
    of 128k: the geometric midpoint of 2304 and 4608 (an expert width of 1086) stopped an H100 with a misaligned
    address (2026-12-07). The CPU grid's hold-outs are the midpoints they were."""
    from softsyn.characterize.catalogue import cell_kinds

    kinds = [k for k in cell_kinds() if k.op in ("MoE", "QMoE")]
    assert {k.key for k in kinds} == {"MoE.fp32", "MoE.fp16", "MoE.bf16", "QMoE.int4", "QMoE.int8"}
    for kind in kinds:
        axes = kind.axes
        points = kind.holdouts(kind.grids["cuda"], 24)
        hidden = {p[axes.index("hidden")] for p in points}
        widths = {p[axes.index("inter")] // 3 for p in points}
        assert all(h % 128 == 0 for h in hidden) and all(w % 128 == 0 for w in widths), (kind.key, hidden, widths)
        assert {2944} <= hidden and {1024} <= widths  # between the grid's 2048/4096 and 768/1536
        cpu = kind.holdouts(kind.grids["cpu"], 24)
        assert {(p[axes.index("hidden")], p[axes.index("inter")]) for p in cpu} >= {(256, 384)}


@pytest.mark.parametrize("where", ["point", "first run"])
def test_a_cuda_failure_records_the_cell_and_stops_the_run_with_what_it_measured(quick_lib, tmp_path, monkeypatch,
                                                                                capsys, where):
    """A CUDA failure at a point (ORT's "CUDA failure 716: misaligned address") leaves the process's device context
    unusable, so the next cell's first call would fail (an H100 run then ended in an internal error, 2026-12-07):
    the cell is recorded as not characterised with the failure named, the run stops with exit 2 and a line saying to
    run it again, and the cells after it are left for that run. The same where the cell's first run (whether the
    provider computes in it) fails so."""
    import shutil

    from softsyn.characterize import plan
    from softsyn.cli import run

    path = tmp_path / "lib.yaml"
    shutil.copy(quick_lib, path)
    error = RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running MoE node. "
                         "Status Message: /onnxruntime_src/core/providers/cuda/cuda_call.cc:154 CUDA failure 716: "
                         "misaligned address ; GPU=0 ; hostname=vm ; file=moe_gemm_profiler.cc ; line=82\n"
                         "std::conditional_t<THRW, void, onnxruntime::common::Status>")
    if where == "point":
        real = plan.measure_point

        def failing(kind, *args, **kwargs):
            if kind.op == "Neg":
                raise error
            return real(kind, *args, **kwargs)

        monkeypatch.setattr(plan, "measure_point", failing)
    else:
        real_runner = plan.Runner

        class FailingRunner(real_runner):
            def __call__(self, *args, **kwargs):
                if any(node.op_type == "Neg" for node in self.model.graph.node):
                    raise error
                return super().__call__(*args, **kwargs)

        monkeypatch.setattr(plan, "Runner", FailingRunner)
    with pytest.raises(SystemExit) as stopped:
        run(["characterize", "--provider", "cpu", "--quick", "--cells", "Neg,Abs", "-o", str(path), "-q"])
    line = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and "\n" not in line, line
    said = "failed at {'elements'" if where == "point" else "does not run: CUDA failure"
    assert f"Neg.fp32.ort-cpu {said}" in line and "CUDA failure 716: misaligned address;" in line
    assert line.endswith("run the same command again to go on from the next cell (rerun with --debug for the trace)")
    data = yaml.safe_load(path.read_text())
    assert data["not_characterised"]["Neg.fp32.ort-cpu"].endswith(": CUDA failure 716: misaligned address")
    assert not any(c["op"] in ("Neg", "Abs") for c in data["cells"])
