"""Plain files a user exports (tests/families.py), their attention and activations as fusion reads them:

* a decoder exported as one forward of (input_ids, attention_mask), no KV cache (GPT-2, Phi-3, Mistral, Qwen2):
  attention fused at every layer (one GroupQueryAttention each, the model's mask as attention_bias), equal to
  the export on ORT CPU under left and right padding, and `softsyn verify` passes;
* every Softmax over a Q.K^T is an attention candidate in fusion.rpt: fused, or a miss row with its reason;
* DeBERTa-v2's disentangled attention is counted and missed with its reason, and its relative-embedding
  projections are no packed-QKV site;
* CLIP's quick_gelu x * sigmoid(1.702 x) becomes QuickGelu(alpha 1.702).
"""
from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as T
from onnx import helper as oh

from families import FAMILIES, export_family
from softsyn.cli import main

NOKV = ("gpt2", "phi3", "mistral", "qwen2")
LAYERS = 2  # every model in tests/families.py
GUIDE = """\
clock_period: 2000ms
input_delay:
  image: 100ms
  text: 10ms
output_delay: 50ms
area_constraint: 80GB
workload:
  batch: 2
  prompt_len: 24
"""
PADDINGS = {  # rows of a batch of 3 x 9 tokens
    "none": [[1] * 9] * 3,
    "right": [[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7],
    "left": [[1] * 9, [0] * 3 + [1] * 6, [0] * 7 + [1] * 2],
}


@pytest.fixture(scope="session")
def plain_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("plain-attention")


@pytest.fixture(scope="session")
def guide(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain-guide") / "guide.yaml"
    path.write_text(GUIDE)
    return path


@pytest.fixture(scope="session")
def compiled(plain_dir, guide, tmp_path_factory):
    """name -> (export, DIR of `softsyn compile EXPORT -c guide --effort low`), each compiled once."""
    done = {}

    def get(name, mask):
        key = (name, mask)
        if key not in done:
            model = export_family(name, plain_dir, mask=mask)
            out = tmp_path_factory.mktemp(f"plain-{name}") / "out"
            result = CliRunner().invoke(main, ["compile", str(model), "-c", str(guide), "--effort", "low", "-o",
                                               str(out), "-q"])
            assert result.exit_code == 0, result.output + repr(result.exception)
            done[key] = (model, out)
        return done[key]

    return get


def fusion_rows(path):
    """({kind: (candidates, fused)}, [(kind, site, reason)], notes) read back from DIR/reports/fusion.rpt."""
    lines = path.read_text().splitlines()
    kinds, misses, notes = {}, [], []
    for i, line in enumerate(lines):
        parts = line.split()
        if len(parts) >= 5 and parts[1].isdigit() and parts[2].isdigit() and parts[0] != "Total":
            kinds[parts[0]] = (int(parts[1]), int(parts[2]))
        if line.startswith("  [") and lines[i + 1].strip().startswith("reason: "):
            kind, site = line.strip()[1:].split("] ", 1)
            misses.append((kind, site, lines[i + 1].strip()[len("reason: "):]))
        if line.startswith("  ") and ": " in line and not line.startswith("  [") and "reason: " not in line:
            notes.append(line.strip())
    return kinds, misses, notes


def _session(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------- no-KV decoders: fused at every layer, equal
@pytest.mark.parametrize("family", NOKV)
def test_a_no_kv_decoder_fuses_attention_at_every_layer_and_verifies(family, compiled):
    model, out = compiled(family, True)
    kinds, misses, notes = fusion_rows(out / "reports" / "fusion.rpt")
    assert kinds["attention"] == (LAYERS, LAYERS), misses
    assert not [m for m in misses if m[0] == "attention"]
    assert any("take the model's padding mask as attention_bias" in n for n in notes), notes
    graph = onnx.load(str(out / "model.onnx")).graph
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == LAYERS and not [n for n in graph.node if n.op_type == "Softmax"]
    assert all(len(n.input) > 10 and n.input[10] for n in gqa)  # attention_bias: the model's own mask
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith("prefill")]
    assert len(rows) == 1 and rows[0][-1] == "MET" and rows[0][-3] == "1.0000", result.output


@pytest.mark.parametrize("family", NOKV)
def test_a_no_kv_decoder_fused_equals_the_export_under_left_and_right_padding(family, compiled):
    """Every position, padded ones included (a left-padded query row with no open key too): the fused cell
    computes what the export does, on ORT CPU."""
    model, out = compiled(family, True)
    ref, fused = _session(model), _session(out / "model.onnx")
    ids = np.random.default_rng(0).integers(0, FAMILIES[family][1]["vocab_size"], (3, 9)).astype(np.int64)
    for padding, rows in PADDINGS.items():
        feeds = {"input_ids": ids, "attention_mask": np.array(rows, dtype=np.int64)}
        want, got = ref.run(None, feeds)[0], fused.run(None, feeds)[0]
        rel = np.abs(want - got).max() / np.abs(want).max()
        assert rel < 1e-5, (family, padding, rel)


def test_the_padding_reading_is_what_a_left_padded_batch_needs(compiled, tmp_path):
    """The same fused GPT-2 with attention_bias taken out (GQA reading the mask as seqlens_k = T - 1, no padding):
    right and left padding then differ from the export, so the equality above is the bias's doing."""
    model, out = compiled("gpt2", True)
    m = onnx.load(str(out / "model.onnx"))
    for n in m.graph.node:
        if n.op_type == "GroupQueryAttention":
            del n.input[10:]
            for a in [a for a in n.attribute if a.name == "causal"]:
                n.attribute.remove(a)
    onnx.save(m, str(tmp_path / "nobias.onnx"))
    ref, bare = _session(model), _session(tmp_path / "nobias.onnx")
    ids = np.random.default_rng(0).integers(0, 512, (3, 9)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.array(PADDINGS["left"], dtype=np.int64)}
    want, got = ref.run(None, feeds)[0], bare.run(None, feeds)[0]
    assert np.abs(want - got).max() / np.abs(want).max() > 1e-2


# ---------------------------------------------------------------- every attention-shaped Softmax is counted
def _attention_softmaxes(path) -> list[str]:
    """The Softmax nodes over a Q.K^T, by a walk of its own: the nearest MatMuls upstream of the Softmax (through
    any op, stopping at MatMuls), one of them a product of two values that depend on a graph input."""
    graph = onnx.load(str(path)).graph
    producer = {o: n for n in graph.node for o in n.output}
    dynamic = {i.name for i in graph.input}
    for n in graph.node:
        if any(i in dynamic for i in n.input):
            dynamic.update(n.output)
    names = []
    for sm in (n for n in graph.node if n.op_type == "Softmax"):
        stack, seen = [(sm.input[0], 0)], set()
        while stack:
            v, depth = stack.pop()
            n = producer.get(v)
            if n is None or n.name in seen or depth > 12:
                continue
            seen.add(n.name)
            if n.op_type == "MatMul":
                if all(i in dynamic for i in n.input):
                    names.append(sm.name)
                    break
                continue
            stack.extend((i, depth + 1) for i in n.input if i in dynamic)
    return names


@pytest.mark.parametrize("name,mask", [("gpt2", True), ("qwen2", True), ("bert", False), ("deberta", True),
                                       ("clip", False)])
def test_every_softmax_over_qk_is_an_attention_candidate_in_the_report(name, mask, compiled):
    model, out = compiled(name, mask)
    sites = _attention_softmaxes(model)
    assert len(sites) == LAYERS
    kinds, misses, _ = fusion_rows(out / "reports" / "fusion.rpt")
    candidates, fused = kinds["attention"]
    rows = [(site, reason) for kind, site, reason in misses if kind == "attention"]
    assert candidates == len(sites) and fused + len(rows) == candidates, (kinds["attention"], rows)
    assert all(reason for _, reason in rows)
    left = {n.name for n in onnx.load(str(out / "model.onnx")).graph.node if n.op_type == "Softmax"}
    for softmax in set(sites) & left:  # a site not fused is a miss row naming its Softmax
        assert any(site.endswith(f"({softmax})") for site, _ in rows), (softmax, rows)
    assert len(set(sites) & left) == len(rows)


def test_deberta_disentangled_attention_is_counted_and_missed_with_its_reason(compiled):
    _, out = compiled("deberta", True)
    kinds, misses, notes = fusion_rows(out / "reports" / "fusion.rpt")
    assert kinds["attention"] == (LAYERS, 0)
    reasons = [r for k, _, r in misses if k == "attention"]
    assert len(reasons) == LAYERS and all(r.startswith("disentangled attention (c2p/p2c position terms") and
                                          "no fused cell" in r for r in reasons), reasons
    # the Q/K/V triple of each layer is a packed-QKV site; the relative embeddings' projections are not one
    assert kinds["packed_qkv"][0] == LAYERS
    assert not [m for m in misses if m[0] == "packed_qkv"], misses
    assert any("projections of a load-time constant not counted" in n for n in notes), notes
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------- QuickGelu with the model's alpha
def test_clip_quick_gelu_is_quickgelu_with_alpha_1_702(compiled):
    model, out = compiled("clip", False)
    kinds, misses, notes = fusion_rows(out / "reports" / "fusion.rpt")
    assert kinds["silu"] == (LAYERS, LAYERS), misses
    graph = onnx.load(str(out / "model.onnx")).graph
    quick = [n for n in graph.node if n.op_type == "QuickGelu"]
    assert len(quick) == LAYERS and not [n for n in graph.node if n.op_type == "Sigmoid"]
    assert all(abs(oh.get_attribute_value(a) - 1.702) < 1e-6 for n in quick for a in n.attribute if a.name == "alpha")
    assert any("QuickGelu alpha 1.702" in n for n in notes), notes
    pixels = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    want, got = _session(model).run(None, {"pixel_values": pixels}), _session(out / "model.onnx").run(
        None, {"pixel_values": pixels})
    for w, g in zip(want, got):
        assert np.abs(w - g).max() / np.abs(w).max() < 1e-5


def _mlp(gate_input: str):
    """y = x * sigmoid(1.702 * a): a = x is quick_gelu, a = the other projection is a gate."""
    nodes = [oh.make_node("MatMul", ["h", "w1"], ["x"]), oh.make_node("MatMul", ["h", "w2"], ["z"]),
             oh.make_node("Mul", [gate_input, "alpha"], ["ax"]), oh.make_node("Sigmoid", ["ax"], ["s"]),
             oh.make_node("Mul", ["x", "s"], ["y"])]
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), n) for n in ("w1", "w2")]
    inits.append(onnx.numpy_helper.from_array(np.array(1.702, dtype=np.float32), "alpha"))
    graph = oh.make_graph(nodes, "mlp", [oh.make_tensor_value_info("h", T.FLOAT, ["batch", "seq", 8])],
                          [oh.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", 16])], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("gate_input,fused", [("x", True), ("z", False)])
def test_quick_gelu_form_and_a_gate_on_a_clip_like_mlp(gate_input, fused, tmp_path):
    import onnx_ir as ir

    from passes.fuse import fuse
    from softsyn.netlist import Netlist

    proto = _mlp(gate_input)
    nl = Netlist(ir.serde.deserialize_model(proto), "mlp", kind="generic")
    (cov,) = fuse(nl, "cpu", kinds=["silu"])
    assert (cov.candidates, cov.fused) == (1, int(fused))
    ops = collections.Counter(n.op_type for n in nl.model.graph)
    if not fused:
        assert "a gate, not x * sigmoid(alpha * x)" in cov.misses[0].reason and ops["Sigmoid"] == 1
        return
    assert ops["QuickGelu"] == 1 and not ops["Sigmoid"] and ops["Mul"] == 0
    quick = next(n for n in nl.model.graph if n.op_type == "QuickGelu")
    assert abs(quick.attributes["alpha"].value - 1.702) < 1e-6
    ir.save(nl.model, str(tmp_path / "fused.onnx"))
    onnx.save(proto, str(tmp_path / "ref.onnx"))
    h = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    want = _session(tmp_path / "ref.onnx").run(None, {"h": h})[0]
    got = _session(tmp_path / "fused.onnx").run(None, {"h": h})[0]
    assert np.abs(want - got).max() / np.abs(want).max() < 1e-6


# ---------------------------------------------------------------- the padding mask's two spellings, built by hand
def _no_kv_attention(fill: float, odd_padding: bool = False):
    """Causal attention without a cache over q, k, v [B, S, N*H] under attention_mask [B, S]: the mask built in
    the graph (causal AND key padding) as Where(allowed, 0, fill), a NaN guard after the Softmax (torch's SDPA
    export). `odd_padding`: a row with any padding opens every key (causal only while nothing is padded)."""
    n_heads, h = 2, 8
    vi = oh.make_tensor_value_info
    ints = onnx.numpy_helper.from_array
    nodes = [
        oh.make_node("Shape", ["attention_mask"], ["t"], start=1, end=2),
        oh.make_node("Squeeze", ["t", "ax0"], ["t0"]),
        oh.make_node("Range", ["zero", "t0", "one"], ["ar"]),
        oh.make_node("Unsqueeze", ["ar", "ax0"], ["keys"]), oh.make_node("Unsqueeze", ["ar", "ax1"], ["queries"]),
        oh.make_node("LessOrEqual", ["keys", "queries"], ["causal"]),
        oh.make_node("Cast", ["attention_mask"], ["pad"], to=T.BOOL),
        oh.make_node("Unsqueeze", ["pad", "ax12"], ["pad4"]),
        oh.make_node("And", ["causal", "pad4"], ["allowed0"]),
    ]
    allowed = "allowed0"
    if odd_padding:
        nodes += [oh.make_node("ReduceMin", ["attention_mask", "ax1"], ["full"], keepdims=1),
                  oh.make_node("Equal", ["full", "one"], ["full_row"]), oh.make_node("Not", ["full_row"], ["padded"]),
                  oh.make_node("Unsqueeze", ["padded", "ax23"], ["padded4"]),
                  oh.make_node("Or", ["allowed0", "padded4"], ["allowed"])]
        allowed = "allowed"
    nodes += [
        oh.make_node("Where", [allowed, "open", "fill"], ["bias"]),
        oh.make_node("Reshape", ["q", "heads"], ["q4"]), oh.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        oh.make_node("Reshape", ["k", "heads"], ["k4"]), oh.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        oh.make_node("Reshape", ["v", "heads"], ["v4"]), oh.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        oh.make_node("MatMul", ["qh", "kt"], ["scores"]), oh.make_node("Mul", ["scores", "scale"], ["scaled"]),
        oh.make_node("Add", ["scaled", "bias"], ["masked"]), oh.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        oh.make_node("IsNaN", ["probs"], ["nan"]), oh.make_node("Where", ["nan", "open", "probs"], ["guarded"]),
        oh.make_node("MatMul", ["guarded", "vh"], ["ctx"]), oh.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        oh.make_node("Reshape", ["ctx_t", "flat"], ["out"]),
    ]
    inits = [ints(np.array([0], np.int64), "ax0"), ints(np.array([1], np.int64), "ax1"),
             ints(np.array([2, 3], np.int64), "ax23"), ints(np.array([1, 2], np.int64), "ax12"),
             ints(np.array(0, np.int64), "zero"), ints(np.array(1, np.int64), "one"),
             ints(np.array(0.0, np.float32), "open"), ints(np.array(fill, np.float32), "fill"),
             ints(np.array(h ** -0.5, np.float32), "scale"), ints(np.array([0, 0, n_heads, h], np.int64), "heads"),
             ints(np.array([0, 0, n_heads * h], np.int64), "flat")]
    x = ["batch", "seq", n_heads * h]
    graph = oh.make_graph(nodes, "no-kv", [vi("q", T.FLOAT, x), vi("k", T.FLOAT, x), vi("v", T.FLOAT, x),
                                           vi("attention_mask", T.INT64, ["batch", "seq"])],
                          [vi("out", T.FLOAT, x)], inits)
    model = onnx.shape_inference.infer_shapes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)],
                                                            ir_version=10))
    return model


@pytest.mark.parametrize("fill,causal", [(-np.inf, 1), (float(np.finfo(np.float32).min), 0)])
def test_a_no_kv_mask_of_either_spelling_fuses_equal_at_every_position(fill, causal, tmp_path):
    """-inf (a padded query row with no open key is zeroed by the NaN guard): causal GQA, which zeroes it too;
    dtype min (the row averages every key): causal=0, the mask alone, which does the same."""
    import onnx_ir as ir

    from passes.fuse import fuse
    from softsyn.netlist import Netlist

    proto = _no_kv_attention(fill)
    nl = Netlist(ir.serde.deserialize_model(proto), "no-kv", kind="decoder")
    (cov,) = fuse(nl, "cpu", kinds=["attention"])
    assert (cov.candidates, cov.fused) == (1, 1), cov.misses
    (gqa,) = [n for n in nl.model.graph if n.op_type == "GroupQueryAttention"]
    assert gqa.inputs[10] is not None and gqa.inputs[10].name == "bias"
    assert (gqa.attributes["causal"].value if "causal" in gqa.attributes else 1) == causal
    ir.save(nl.model, str(tmp_path / "fused.onnx"))
    onnx.save(proto, str(tmp_path / "ref.onnx"))
    ref, fused = _session(tmp_path / "ref.onnx"), _session(tmp_path / "fused.onnx")
    rng = np.random.default_rng(2)
    qkv = {n: rng.standard_normal((3, 9, 16)).astype(np.float32) for n in ("q", "k", "v")}
    for padding, rows in PADDINGS.items():
        feeds = dict(qkv, attention_mask=np.array(rows, dtype=np.int64))
        want, got = ref.run(None, feeds)[0], fused.run(None, feeds)[0]
        assert np.all(np.isfinite(got)) and np.abs(want - got).max() < 1e-5, (padding, np.abs(want - got).max())


def test_a_mask_that_opens_non_causal_keys_on_padded_rows_is_a_miss_with_its_reason():
    import onnx_ir as ir

    from passes.fuse import fuse
    from softsyn.netlist import Netlist

    nl = Netlist(ir.serde.deserialize_model(_no_kv_attention(-np.inf, odd_padding=True)), "no-kv", kind="decoder")
    (cov,) = fuse(nl, "cpu", kinds=["attention"])
    assert (cov.candidates, cov.fused) == (1, 0)
    assert "opens a non-causal key on padded rows" in cov.misses[0].reason, cov.misses[0].reason


def test_verify_names_a_scenario_the_reference_model_cannot_run(plain_dir, tmp_path):
    """GPT-2's position table ends at n_positions: a prompt past it is what the constraints asked of the user's
    model, so verify says so in one line and exits 2 (it was an internal error, exit 3)."""
    model = export_family("gpt2", plain_dir, mask=True)
    guide = tmp_path / "long.yaml"
    guide.write_text(GUIDE.replace("prompt_len: 24", "prompt_len: 200"))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", str(model), "-c", str(guide), "--effort", "low", "-o", str(out),
                                       "-q"])
    assert result.exit_code in (0, 1), result.output + repr(result.exception)
    proc = subprocess.run([sys.executable, "-m", "softsyn", "verify", str(out), "-q"], capture_output=True,
                          text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "the reference model cannot run scenario" in lines[0] and "give that group smaller dims" in lines[0], lines
