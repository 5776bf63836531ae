"""The kv_layout pass (issue 13): qwen3-tiny's KV ports become one max_length buffer GroupQueryAttention updates in
place, and prefill emits the last position's logits. Proven against the artifact compiled without the pass: the
same greedy tokens from softsyn's shared-buffer loop and from onnxruntime-genai as from the grown loop, the same
last-position logits; the structure on the CPU and cuda graphs, verify on both, the timing and the KV area."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from genai_tokens import genai_tokens
import passes
from paths import ROOT
from softsyn.constraints import parse_constraints
from softsyn.design import Design
from softsyn.flow.compile import compile_design
from softsyn.flow.verify import reference_record, verify
from softsyn.frontends import read_design
from softsyn.library import load_library
from passes import LOW, Effort, run_pass
from softsyn.runtime.decoder import decoder_io
from softsyn.runtime.generate import Generator, prompt_ids
from softsyn.runtime.session import open_model
from softsyn.timing.cost import node_work

CPU_TINY = ROOT / "constraints" / "cpu-tiny.yaml"
MAX_LENGTH = 512  # cpu-tiny.yaml's kv_cache.max_length
# chat-h200.yaml at a context qwen3-tiny's rotary caches hold: fp16 (bf16 realised), fp8 KV asked for
CUDA_TINY = """target: h200-ort-cuda
area_constraint: 1GiB
workload: {batch: 1, prompt_len: 64, context_len: 256}
path_groups:
  prefill: {kind: prefill, clock_period: 150ms, dims: {batch: 1, seq: 64, past: 0}}
  decode: {kind: decode, clock_period: 8ms, dims: {batch: 1, seq: 1, past: 256}}
accuracy: {max_rel_error: 1%}
precision: {allowed: [bf16, fp16], default: bf16}
kv_cache: {dtype: fp8, max_length: 1024}
"""


def compile_tiny(out, constraints, cache_dir, effort="low", options=None):
    design = Design.load("zoo:qwen3-tiny", constraints, cache_dir=cache_dir, progress=False, materialize=True)
    compile_design(design, effort, out, reference_record("zoo:qwen3-tiny", design.netlist), options=options)
    return out


@pytest.fixture(scope="module")
def without_kv_layout(cache_dir, tmp_path_factory):
    """qwen3-tiny compiled by the low script less kv_layout: a grown cache and every position's logits."""
    level = Effort("no-kv-layout", "low without kv_layout", tuple(s for s in LOW.steps if s.pass_name != "kv_layout"))
    passes.EFFORTS[level.name] = level
    try:
        return compile_tiny(tmp_path_factory.mktemp("nokv") / "out", CPU_TINY, cache_dir, level.name)
    finally:
        passes.EFFORTS.pop(level.name)


@pytest.fixture(scope="module")
def cuda_artifact(cache_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("cuda-kv") / "c.yaml"
    path.write_text(CUDA_TINY)
    return compile_tiny(path.parent / "out", path, cache_dir)


def gqa_nodes(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == "GroupQueryAttention"]


def assert_shared_structure(model: ir.Model, length: int):
    inputs = {v.name: v for v in model.graph.inputs}
    outputs = {v.name: v for v in model.graph.outputs}
    nodes = gqa_nodes(model)
    assert len(nodes) == 2
    for i, node in enumerate(nodes):
        for kind, past, present in (("key", 3, 1), ("value", 4, 2)):
            assert node.inputs[past] is inputs[f"past_key_values.{i}.{kind}"]
            assert node.outputs[present] is outputs[f"present.{i}.{kind}"]
            for port in (node.inputs[past], node.outputs[present]):
                assert [str(d) if not isinstance(d, int) else d for d in port.shape] == ["batch", 2, length, 32]
            assert len(node.inputs[past].uses()) == 1  # GQA alone reads the buffer
        seqlens, total = node.inputs[5].producer(), node.inputs[6].producer()
        assert seqlens.op_type == "Cast" and seqlens.attributes["to"].value == ir.DataType.INT32
        assert total.op_type == "Cast" and total.attributes["to"].value == ir.DataType.INT32
        assert total.inputs[0].producer().inputs[0].producer().op_type == "Shape"  # the mask's width, on the host
        assert total.inputs[0].producer().inputs[0].producer().inputs[0] is inputs["attention_mask"]
        assert seqlens.inputs[0].producer().op_type == "Sub"
    io = decoder_io(model)
    assert io.shares_buffer and io.buffer_length == length
    assert [d if isinstance(d, int) else str(d) for d in outputs["logits"].shape] == ["batch", 1, 1024]


def test_cpu_artifact_has_the_shared_layout(tiny_cpu_artifact):
    assert_shared_structure(ir.load(str(tiny_cpu_artifact / "model.onnx")), MAX_LENGTH)
    log = (tiny_cpu_artifact / "compile.log").read_text()
    assert "kv_layout" in log and "past_present_share_buffer true" in log


def test_shared_buffer_generates_the_grown_artifacts_tokens(tiny_cpu_artifact, without_kv_layout):
    pytest.importorskip("onnxruntime_genai", reason="make install puts it in .venv (pip install --no-deps "
                        "onnxruntime-genai==0.18.0); without it the grown-vs-shared check above still ran")
    prompt, n = prompt_ids(1024, 32, 0), 16
    grown_io = decoder_io(ir.load(str(without_kv_layout / "model.onnx")))
    assert not grown_io.shares_buffer
    grown = Generator(open_model(without_kv_layout / "model.onnx"), grown_io).generate(prompt, n)
    shared_io = decoder_io(ir.load(str(tiny_cpu_artifact / "model.onnx")))
    shared = Generator(open_model(tiny_cpu_artifact / "model.onnx"), shared_io).generate(prompt, n)
    assert (grown.kv, shared.kv) == ("grown", "shared")
    assert shared.tokens == grown.tokens and len(set(grown.tokens)) > 1
    tokens = genai_tokens(tiny_cpu_artifact, prompt, n)  # genai_config.json: past_present_share_buffer true
    assert tuple(tokens) == grown.tokens


def test_last_position_logits_equal_the_full_logits_last_row(tiny_cpu_artifact, without_kv_layout):
    prompt = prompt_ids(1024, 24, 3).reshape(1, -1)
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt), "position_ids": np.arange(24)[None]}
    full_session, last_session = open_model(without_kv_layout / "model.onnx"), open_model(tiny_cpu_artifact / "model.onnx")
    empty = np.zeros((1, 2, 0, 32), np.float32)
    full = full_session.run(["logits"], {**feeds, **{i.name: empty for i in full_session.get_inputs()
                                                      if i.name.startswith("past")}})[0]
    buffer = np.zeros((1, 2, MAX_LENGTH, 32), np.float32)
    last = last_session.run(["logits"], {**feeds, **{i.name: buffer for i in last_session.get_inputs()
                                                      if i.name.startswith("past")}})[0]
    assert full.shape == (1, 24, 1024) and last.shape == (1, 1, 1024)
    np.testing.assert_allclose(last[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)


def test_all_logits_keeps_every_position(cache_dir, tmp_path):
    out = compile_tiny(tmp_path / "out", CPU_TINY, cache_dir, options={"kv_layout": {"last_token_logits": False}})
    model = ir.load(str(out / "model.onnx"))
    logits = next(v for v in model.graph.outputs if v.name == "logits")
    assert [str(d) if not isinstance(d, int) else d for d in logits.shape] == ["batch", "seq", 1024]
    assert decoder_io(model).shares_buffer  # the KV layout is applied all the same
    assert not verify(out).violations


def test_verify_passes_on_both_targets(tiny_cpu_artifact, cuda_artifact):
    for out in (tiny_cpu_artifact, cuda_artifact):
        result = verify(out)
        assert not result.violations
        assert {c.output for c in result.checks} >= {"logits", "present.0.key", "present.1.value"}


def test_cuda_graph_has_the_shared_layout(cuda_artifact):
    model = ir.load(str(cuda_artifact / "model.onnx"))
    assert_shared_structure(model, 1024)
    assert all(n.inputs[3].dtype == ir.DataType.FLOAT16 for n in gqa_nodes(model))
    report = (cuda_artifact / "compile.log").read_text()
    assert "past_present_share_buffer true" in report


def test_decode_timing_reads_the_cached_positions_not_the_buffer(tiny_cpu_artifact):
    design = Design(read_design(str(tiny_cpu_artifact / "model.onnx"), progress=False),
                    parse_constraints(CPU_TINY.read_text()), load_library("cpu-ort"), progress=False)
    shapes = design.netlist.bind({"batch": 1, "seq": 1, "past": 256})
    node = gqa_nodes(design.netlist.model)[0]
    work = node_work(node, shapes)
    assert work.sizes["kv_len"] == 257  # past + seq, not the 512 positions of the buffer
    per_position = 2 * 2 * 32 * 4  # K and V, kv heads x head dim fp32
    assert work.bytes < per_position * MAX_LENGTH  # the buffer is not read whole
    prefill = node_work(node, design.netlist.bind({"batch": 1, "seq": 128, "past": 0}))
    assert prefill.sizes["kv_len"] == 128


def test_kv_area_is_the_max_length_buffers(tiny_cpu_artifact):
    design = Design(read_design(str(tiny_cpu_artifact / "model.onnx"), progress=False),
                    parse_constraints(CPU_TINY.read_text()), load_library("cpu-ort"), progress=False)
    area = design.analyze().area
    budget = area.kv_budget
    assert budget.tensors == 4 and budget.layout == f"[batch, 2, {MAX_LENGTH}, 32]"
    assert budget.bytes_per_token == 2 * 2 * 2 * 32 * 4  # layers x K,V x kv heads x head dim x fp32
    assert (budget.length, budget.length_key) == (MAX_LENGTH, "kv_cache.max_length")
    kinds = {k.name: k.bytes for k in area.by_kind}
    assert kinds["kv_cache"] == budget.bytes_per_token * MAX_LENGTH


def test_without_gqa_kv_cache_the_pass_does_nothing_and_says_why(cache_dir):
    design = Design(read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False),
                    parse_constraints(CPU_TINY.read_text()), load_library("cpu-ort"), progress=False)
    result = run_pass(design, "kv_layout", {"last_token_logits": False})  # not fused: no GroupQueryAttention
    assert result.counts == {} and not result.report.applied
    assert "no GroupQueryAttention" in result.report.reason


def test_dont_touch_on_attention_keeps_the_layout(cache_dir):
    design = Design(read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False),
                    parse_constraints(CPU_TINY.read_text()), load_library("cpu-ort"), progress=False)
    run_pass(design, "fuse")
    design.constraints.dont_touch = ["model.layers.1.self_attn"]
    result = run_pass(design, "kv_layout", {"last_token_logits": False})
    assert not result.report.applied and "dont_touch" in result.report.reason
    assert not decoder_io(design.netlist.model).shares_buffer


def test_int8_kv_is_reported_not_applied(cuda_artifact):
    log = (cuda_artifact / "compile.log").read_text()
    assert "kv_cache.dtype fp8: not applied" in log


def test_cuda_decode_is_a_captured_graph_and_prefill_eager(cuda_artifact):
    """A shared KV buffer and every node on CUDA: decode runs as a captured CUDA graph, which the runtime settings
    enable and the STA times without host launches; prefill (varying prompt length) stays eager, and says why. The
    settings carry the attention kernels every softsyn CUDA session uses (no cuDNN SDPA: a graph built per prompt
    length), to ORT and to genai alike."""
    import dataclasses
    import json

    from softsyn.timing import TimingRequest, time_group
    from softsyn.timing.capture import group_launch

    session = json.loads((cuda_artifact / "runtime" / "session.json").read_text())
    assert session["provider_options"]["CUDAExecutionProvider"] == {"enable_cuda_graph": "1", "sdpa_kernel": "19"}
    assert session["cuda_graph"]["decode"].startswith("CUDA graph (enable_cuda_graph=1; 1.07 us per node")
    assert session["cuda_graph"]["prefill"].startswith("eager (not a decode step")
    genai = json.loads((cuda_artifact / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {"enable_cuda_graph": "1",
                                                                                             "sdpa_kernel": "19"}}]
    assert "Launch: CUDA graph" in (cuda_artifact / "reports" / "timing.rpt").read_text()

    library = load_library("h200-ort-cuda")
    design = Design(read_design(str(cuda_artifact / "model.onnx"), progress=False),
                    parse_constraints(CUDA_TINY), library, progress=False)
    decode = next(g for g in design.groups if g.name == "decode")
    captured = design.launches["decode"]
    assert captured.captured and not design.launches["prefill"].captured
    graph = time_group(design.netlist, design.graph, library, design.constraints, decode, TimingRequest(mode=captured))
    eager = time_group(design.netlist, design.graph, library, design.constraints, decode)
    assert graph.critical.arrival < eager.critical.arrival and eager.launch == ""
    # a node the provider cannot run (the library recorded it) keeps the whole group eager, named
    refusing = dataclasses.replace(library, header={**library.header, "not_characterised": {
        "GroupQueryAttention.fp16.ort-cuda": "does not run: test"}})
    why = group_launch(design.netlist, refusing, decode.scenario.dims, True)
    assert not why.captured and "GroupQueryAttention.fp16 does not run on CUDAExecutionProvider" in why.reason


def test_graph_tables_time_a_captured_group_only(cuda_artifact):
    """A cell measured as CUDA graph replays (implementation *-graph) sets its node's device time inside a captured
    decode; eager groups, and sizes off the table's one row, keep the copies-measured table."""
    import dataclasses

    from softsyn.library import Cell
    from softsyn.library.model import GRAPH_SUFFIX
    from softsyn.timing import TimingRequest, time_group
    from softsyn.timing.sta import cell_timings, in_graph

    library = load_library("h200-ort-cuda")
    table = Cell(op="MatMul", precision="fp16", implementation="ort-cuda" + GRAPH_SUFFIX, axes=["m", "n", "k"],
                 points=[[1.0], [64.0, 4096.0], [64.0, 4096.0]], delays=[[[3e-6, 4e-6], [5e-6, 6e-6]]])
    eager = [c for c in library.cells if not c.implementation.endswith(GRAPH_SUFFIX)]  # the shipped graph tables out
    graphed = dataclasses.replace(library, cells=[*eager, table])
    library = dataclasses.replace(library, cells=eager)
    assert graphed.graph_delay("MatMul", "fp16", {"m": 1, "n": 64, "k": 4096}) == pytest.approx(4e-6)
    assert graphed.graph_delay("MatMul", "fp16", {"m": 2, "n": 64, "k": 64}) is None  # off its one row
    assert graphed.cell_for("MatMul", "fp16", {"m": 1, "n": 64, "k": 64}).implementation == "ort-cuda"  # eager

    design = Design(read_design(str(cuda_artifact / "model.onnx"), progress=False),
                    parse_constraints(CUDA_TINY), graphed, progress=False)
    decode = next(g for g in design.groups if g.name == "decode")
    shapes = design.netlist.bind(decode.scenario.dims)
    cells = cell_timings(design.netlist, graphed, shapes)
    eager_device = {id(c.node): c.device for c in cells}
    in_graph(cells, graphed)
    matmuls = [c for c in cells if c.cell == "MatMul.fp16" and c.device > 0]
    assert matmuls and all(c.host == 0.0 for c in cells)
    for c in matmuls:
        assert c.device == pytest.approx(graphed.graph_delay("MatMul", "fp16", c.work.sizes))
        assert c.device != eager_device[id(c.node)]
    # the compile loop's option tables read the same graph table for the captured group, the eager tables for prefill
    from passes.optimize import mapping

    cands, _ = mapping.candidates(design)
    tables = mapping.delay_tables(design, cands)
    by_name = {n.name: n for n in design.netlist.nodes()}
    for cand in cands:
        sizes = node_work(by_name[cand.name], shapes).sizes
        if graphed.graph_delay("MatMul", "fp16", sizes) is not None:
            assert tables["decode"][cand.name]["fp16"] == pytest.approx(graphed.graph_delay("MatMul", "fp16", sizes))
            assert tables["prefill"][cand.name]["fp16"] != tables["decode"][cand.name]["fp16"]
    request = TimingRequest(mode=design.launches["decode"])
    captured = time_group(design.netlist, design.graph, graphed, design.constraints, decode, request)
    plain = time_group(design.netlist, design.graph, library, design.constraints, decode, request)
    assert captured.critical.arrival != plain.critical.arrival


def test_cuda_artifact_runs_on_the_cpu_through_its_cpu_view(cuda_artifact):
    """`softsyn run --provider cpu` on a cuda artifact (GQA with absorbed q/k norms, which ORT's CPU kernel refuses)
    generates through the CPU view, as verify checks it, and says so."""
    from softsyn.flow.run import RunSettings, run
    from reports.run import report_run

    result = run(cuda_artifact, RunSettings(prompt_len=16, gen=4, provider="cpu", runs=1, warmup=0), show_progress=False)
    assert result.viewed == 2 and len(result.generations[0].tokens) == 4
    assert "CPU view: 2 GroupQueryAttention nodes" in report_run(result)
