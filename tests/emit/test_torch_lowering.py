"""The cpu-torch lowering: DIR/model.pt2 and runtime/torch.json written instead of the ONNX Runtime files, the package
measured per path group and labelled beside the library's estimate."""
import json
import re

import pytest

from helpers import cli
from softsyn.runtime.torch_package import read_torch_settings


def test_package_and_settings_written(tiny_torch_artifact):
    out = tiny_torch_artifact
    assert (out / "model.pt2").stat().st_size > 0
    assert not (out / "model.onnx").exists() and not (out / "runtime" / "session.json").exists()
    settings = read_torch_settings(out)
    assert settings["kv_cache"] == {**settings["kv_cache"], "layers": 2, "kv_heads": 2, "head_dim": 32,
                                    "max_length": 512}
    assert settings["vocab_size"] == 1024 and settings["dtype"] == "float32"
    assert settings["reference"]["source"] == "zoo:qwen3-tiny"
    assert set(settings["scenarios"]) == {"prefill", "decode"}
    manifest = json.loads((out / "softsyn-manifest.json").read_text())
    assert "model.pt2" in json.dumps(manifest) and "runtime/torch.json" in json.dumps(manifest)


def test_measured_numbers_are_labelled(tiny_torch_artifact):
    log = (tiny_torch_artifact / "compile.log").read_text()
    measured = re.findall(r"^note: target cpu-torch: (prefill|decode) \(.*\): [\d.]+ ms \(torch package, measured, "
                          r"median of 10\); [\d.]+ ms \(est, cpu-ort library", log, re.M)
    assert sorted(measured) == ["decode", "prefill"]
    assert "note: target cpu-torch: weights fp32 (the compile's map quantised none)" in log
    rpt = (tiny_torch_artifact / "reports" / "torch.rpt").read_text()
    assert rpt.count("torch package, measured") == 3 and rpt.count("(est, cpu-ort library") == 2


def test_a_weightless_plan_is_refused(cache_dir, tmp_path, capsys):
    code, out, err = cli(capsys, "compile", "zoo:qwen3-tiny", "--target", "cpu-torch", "--plan", "-o", tmp_path / "o",
                         "--cache-dir", cache_dir, "-q")
    assert code == 2 and err.count("\n") == 1
    assert "target cpu-torch lowers a model with weights" in err and not (tmp_path / "o").exists()


def _tiny_model():
    from softsyn.emit.torch_attention_forms import ATTENTIONS  # registers softsyn's attentions with transformers
    from softsyn.frontends import source_torch_model

    model = source_torch_model("zoo:qwen3-tiny")
    return model, ATTENTIONS


IDS = [[3, 14, 15, 92]]


def packed_tiny():
    """(zoo:qwen3-tiny in torch, SDPA attention and packed projections, ready for quantise_modules; the float
    model's logits for IDS, taken before packing)."""
    import torch

    from softsyn.emit.torch_step import pack_projections

    model, attentions = _tiny_model()
    with torch.no_grad():
        want = model(input_ids=torch.tensor(IDS)).logits
    model.set_attn_implementation(attentions["sdpa"][0])
    pack_projections(model)
    return model, want


def exported_step(model):
    """(the step torch.export makes of `model` over a 16-slot cache, what AOTInductor compiles; its logits for IDS)."""
    import torch

    from softsyn.emit.torch_lowering import export_step
    from softsyn.emit.torch_step import StaticStep
    from softsyn.frontends.export import kv_geometry

    layers, kv, head_dim = kv_geometry(model.config)
    program = export_step(StaticStep(model, 16).eval(), model.config, 16, "cpu", torch.float32)
    cache = [torch.zeros(1, kv, 16, head_dim) for _ in range(2 * layers)]
    with torch.no_grad():
        return program, program.module()(torch.tensor(IDS), torch.arange(4)[None], torch.arange(4), *cache)


@pytest.mark.parametrize("form", ["sdpa", "matmul", "split", "by_seq", "softsyn"])
def test_grouped_attention_equals_transformers_sdpa_with_repeated_kv(form):
    """K and V are never repeated per query head, yet either form gives transformers' masked SDPA (which repeats
    them), for one query (decode) and several (prefill), GQA 2:1."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from softsyn.emit.torch_attention_forms import ATTENTIONS

    grouped_attention = ATTENTIONS[form][1]

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 2, True, False
    for seq in (1, 5):
        q = torch.randn(2, 4, seq, 16, generator=g)
        k, v = torch.randn(2, 2, 12, 16, generator=g), torch.randn(2, 2, 12, 16, generator=g)
        positions = torch.arange(6, 6 + seq)[None].expand(2, seq)
        mask = (torch.arange(12)[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, seq, 12]
        got, _ = grouped_attention(module, q, k, v, mask, scaling=0.25)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
        assert got.shape == want.shape == (2, seq, 4, 16)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [0, 3])
def test_the_prompt_form_equals_transformers_sdpa_over_a_span_ending_at_the_last_position(window):
    """The prompt form takes its causal mask from the shapes (bottom-right aligned): over a span that ends at the
    step's last position it is transformers' masked SDPA, at a first prompt and after a past, GQA 2:1; a
    sliding-window layer takes the step's mask (here one of a window of 3)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from softsyn.emit.torch_attention_forms import ATTENTIONS

    prompt_attention = ATTENTIONS["prompt"][1]
    g = torch.Generator().manual_seed(1)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = 2, True, False
    module.sliding_window = window or None
    for past, seq in ((0, 5), (7, 5), (7, 1)):
        span = past + seq
        q = torch.randn(2, 4, seq, 16, generator=g)
        k, v = torch.randn(2, 2, span, 16, generator=g), torch.randn(2, 2, span, 16, generator=g)
        positions = torch.arange(past, span)[None, :, None]
        mask = (torch.arange(span)[None, None, :] <= positions)[:, None].expand(2, 1, seq, span)
        if window:
            mask = mask & (torch.arange(span)[None, None, None, :] > positions[:, None] - window)
        got, _ = prompt_attention(module, q, k, v, mask, scaling=0.25)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["sdpa", "matmul", "split", "by_seq", "softsyn"])
def test_static_step_writes_the_cache_in_place_and_generates_what_transformers_does(form):
    """The step module torch.export lowers, run eagerly: a prefill then decode steps over one static cache (written in
    place, stale slots masked, attention over a span of it from the exact prefix to the whole) give the logits of
    transformers' own forward over the whole sequence."""
    import torch

    from softsyn.emit.torch_step import StaticStep
    from softsyn.frontends.export import kv_geometry

    model, attentions = _tiny_model()
    layers, kv, head_dim = kv_geometry(model.config)
    cache = [torch.full((1, kv, 16, head_dim), 7.0) for _ in range(2 * layers)]  # stale values: must stay masked
    ids = torch.tensor([[3, 14, 15, 92]])
    with torch.no_grad():
        want = model(input_ids=torch.cat([ids, torch.tensor([[65, 35]])], 1)).logits
        model.set_attn_implementation(attentions[form][0])
        step = StaticStep(model, 16).eval()
        slots = torch.arange(16)
        prefill = step(ids, torch.arange(4)[None], slots[:4], *cache)  # spans: the filled prefix, or more of it
        first = step(torch.tensor([[65]]), torch.tensor([[4]]), slots[:8], *cache)
        second = step(torch.tensor([[35]]), torch.tensor([[5]]), slots, *cache)
    torch.testing.assert_close(prefill, want[:, :4], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat([first, second], 1), want[:, 4:], rtol=1e-4, atol=1e-4)
    assert all(float(c[:, :, 6:].sub(7).abs().max()) == 0 for c in cache)  # slots past the sequence untouched
    assert all(float(c[:, :, :6].sub(7).abs().min()) > 0 for c in cache)


@pytest.mark.parametrize("keeps", [True, False])
def test_last_logits_step_returns_the_last_position_and_exports(keeps):
    """StaticStep(last_logits=True): logits [B, 1, vocab], the full step's last position, through transformers'
    logits_to_keep (the lm_head reads one row) or, for a forward without it, sliced after; the exported program
    (what AOTInductor compiles) keeps the one-row lm_head at any prompt length."""
    import torch

    from softsyn.emit.torch_lowering import export_step
    from softsyn.emit.torch_step import StaticStep
    from softsyn.frontends.export import kv_geometry

    model, _ = _tiny_model()
    layers, kv, head_dim = kv_geometry(model.config)
    ids, positions, slots = torch.tensor([[3, 14, 15, 92, 6]]), torch.arange(5)[None], torch.arange(8)
    step = StaticStep(model, 16, last_logits=True).eval()
    if not keeps:  # a model whose forward takes no logits_to_keep
        step.keep = False
    with torch.no_grad():
        full = StaticStep(model, 16).eval()(ids, positions, slots, *[torch.zeros(1, kv, 16, head_dim)
                                                                      for _ in range(2 * layers)])
        got = step(ids, positions, slots, *[torch.zeros(1, kv, 16, head_dim) for _ in range(2 * layers)])
    assert full.shape[1] == 5 and got.shape == (1, 1, full.shape[2])
    torch.testing.assert_close(got, full[:, -1:], rtol=1e-5, atol=1e-5)
    if keeps:
        program = export_step(step, model.config, 16, "cpu", torch.float32, prefill=True)
        heads = [n for n in program.graph.nodes if n.op == "call_function" and "linear" in str(n.target)
                 and n.meta["val"].shape[-1] == model.config.vocab_size]
        assert len(heads) == 1 and heads[0].args[0].meta["val"].shape[1] == 1  # the lm_head reads one position


def test_split_softmax_is_softmax_over_any_span():
    """The chunked max and sum give torch's softmax whatever the span (shorter than a chunk, a chunk, not a multiple
    of it) and with masked (-inf) slots, whole masked chunks included."""
    import torch

    from softsyn.emit.torch_attention_forms import SPLIT_CHUNK, split_softmax

    g = torch.Generator().manual_seed(0)
    for span in (1, SPLIT_CHUNK - 1, SPLIT_CHUNK, SPLIT_CHUNK + 1, 5 * SPLIT_CHUNK + 3):
        scores = torch.randn(2, 3, 4, span, generator=g) * 8
        scores[..., span // 2:] = float("-inf")  # the slots after the query's position
        scores[..., 0] = scores[..., 0].clamp(min=-1)  # every row sees a slot
        torch.testing.assert_close(split_softmax(scores), torch.softmax(scores, -1), rtol=1e-6, atol=1e-7)


def test_a_prefill_program_is_traced_at_a_prompt_length_and_still_serves_short_ones():
    """export_step(prefill=True): the example query length is a prompt's (up to PREFILL_SEQ_HINT, half the span), the
    length Inductor tunes the prefill package's kernels for, and the program still runs the eager step's function at
    2 and 5 positions (the dim stays dynamic)."""
    import torch

    from softsyn.emit.torch_lowering import PREFILL_SEQ_HINT, export_step
    from softsyn.emit.torch_step import StaticStep
    from softsyn.frontends.export import kv_geometry

    model, attentions = _tiny_model()
    model.set_attn_implementation(attentions["sdpa"][0])
    length = 64
    step = StaticStep(model, length).eval()
    program = export_step(step, model.config, length, "cpu", torch.float32, prefill=True)
    assert program.example_inputs[0][0].shape == (2, min(PREFILL_SEQ_HINT, (length - 1) // 2)) == (2, 31)
    layers, kv, head_dim = kv_geometry(model.config)
    for seq in (2, 5):
        outs = []
        for run in (step, program.module()):
            cache = [torch.zeros(1, kv, length, head_dim) for _ in range(2 * layers)]
            with torch.no_grad():
                outs.append(run(torch.arange(10, 10 + seq)[None], torch.arange(seq)[None], torch.arange(16), *cache))
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_the_exported_split_step_serves_spans_below_and_above_a_chunk():
    """export_step (the lowering's torch.export, span dynamic) with the split attention: the exported program runs at
    a span shorter than one chunk and at one of several chunks (neither specialised away) and gives the eager step's
    logits."""
    import torch

    from softsyn.emit.torch_lowering import export_step
    from softsyn.emit.torch_attention_forms import SPLIT_CHUNK
    from softsyn.emit.torch_step import StaticStep
    from softsyn.frontends.export import kv_geometry

    model, attentions = _tiny_model()
    model.set_attn_implementation(attentions["split"][0])
    length = 3 * SPLIT_CHUNK
    step = StaticStep(model, length).eval()
    program = export_step(step, model.config, length, "cpu", torch.float32).module()
    layers, kv, head_dim = kv_geometry(model.config)
    for span in (16, length - 8):  # the whole cache trips a guard of .module() only: the package runs it (flow tests)
        outs = []
        for run in (step, program):
            cache = [torch.zeros(1, kv, length, head_dim) for _ in range(2 * layers)]
            with torch.no_grad():
                run(torch.tensor([[3, 14, 15]]), torch.arange(3)[None], torch.arange(span), *cache)
                outs.append(run(torch.tensor([[92]]), torch.tensor([[3]]), torch.arange(span), *cache))
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_the_exported_by_seq_step_takes_each_branch_by_the_query_length():
    """export_step with the by_seq attention (torch.cond on the query length): the exported program's prefill (SDPA
    branch) and decode (matmul branch) give the eager step's logits, and it holds the cond (neither branch specialised
    away at export). No target uses the form (torch 2.11's AOTInductor fails on it on the H200, 2026-12-03: h200-torch
    builds a prefill package instead), so the program is run as exported, without AOTInductor's minute on 2 cores."""
    import torch

    from softsyn.emit.torch_lowering import export_step
    from softsyn.emit.torch_step import StaticStep
    from softsyn.frontends.export import kv_geometry

    model, attentions = _tiny_model()
    model.set_attn_implementation(attentions["by_seq"][0])
    length = 64
    step = StaticStep(model, length).eval()
    program = export_step(step, model.config, length, "cpu", torch.float32)
    assert any("cond" in str(node.target) for node in program.graph.nodes)
    package = program.module()
    layers, kv, head_dim = kv_geometry(model.config)
    outs = []
    for run in (step, package):
        cache = [torch.zeros(1, kv, length, head_dim) for _ in range(2 * layers)]
        with torch.no_grad():
            got = [run(torch.tensor([[3, 14, 15]]), torch.arange(3)[None], torch.arange(16), *cache),
                   run(torch.tensor([[92]]), torch.tensor([[3]]), torch.arange(16), *cache)]
        outs.append([g[0] if isinstance(g, (list, tuple)) else g for g in got])
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_packed_projections_compute_what_the_separate_ones_did():
    """QKV and gate/up become one matmul per layer (PackedLinear, the Linear modules replaced by parts of it) and the
    model's logits stay those of the separate projections."""
    import torch

    from softsyn.emit.torch_step import PackedLinear, PackedPart, pack_projections

    model, _ = _tiny_model()
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        assert pack_projections(model) == 2 * model.config.num_hidden_layers
        got = model(input_ids=ids).logits
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.k_proj, PackedPart) and isinstance(layer.mlp.up_proj, PackedPart)
    assert isinstance(layer.self_attn.q_proj.packed, PackedLinear) and layer.self_attn.q_proj.packed._parts is None
    assert layer.mlp.gate_proj.packed.linear.weight.shape == (2 * model.config.intermediate_size,
                                                               model.config.hidden_size)
    assert type(layer.mlp.down_proj) is torch.nn.Linear  # its input is not another projection's
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fp16_step_keeps_rotary_fp32_and_far_positions_right():
    """h200-torch's cast (parameters to fp16, buffers as built): at position 4000 the fp16 step's keys stay within
    fp16 rounding of the fp32 step's (an fp16 inv_freq put them 7.5 % off)."""
    import torch

    from softsyn.emit.torch_step import StaticStep, cast_parameters
    from softsyn.frontends.export import kv_geometry

    model, attentions = _tiny_model()
    layers, kv, head_dim = kv_geometry(model.config)
    ids, positions = torch.tensor([[5, 6]]), torch.tensor([[4000, 4001]])
    keys = {}
    for dtype in (torch.float32, torch.float16):
        if dtype == torch.float16:
            cast_parameters(model, dtype)
            assert model.model.rotary_emb.inv_freq.dtype == torch.float32
        model.set_attn_implementation(attentions["matmul"][0])
        cache = [torch.zeros(1, kv, 4096, head_dim, dtype=dtype) for _ in range(2 * layers)]
        with torch.no_grad():
            StaticStep(model, 4096).eval()(ids, positions, torch.arange(4096), *cache)
        keys[dtype] = cache[0][:, :, 4000:4002].float()
    rel = float((keys[torch.float16] - keys[torch.float32]).abs().max() / keys[torch.float32].abs().max())
    assert rel < 5e-3, rel


def test_the_compile_s_int8_cells_become_torchao_int8_modules_and_still_compute_the_function():
    """quantise_modules: the map's int8 cells (a packed group at its most accurate part's precision) become torchao
    int8 weight-only Linear layers, an int4 cell is kept float and said so (not built); the quantised step still
    exports (torch.export, what AOTInductor compiles), and its logits stay within int8's error of the float model's."""
    import torch

    from softsyn.emit.torch_step import WeightCell, quantise_modules

    model, want = packed_tiny()
    int8, int4 = WeightCell("int8", 0), WeightCell("int4", 32)
    notes = quantise_modules(model, {"model.layers.0.self_attn.q_proj": int8, "model.layers.0.mlp.down_proj": int8,
                                     "model.layers.1.mlp.up_proj": int4}, "fp32", ("int8",)).notes
    layer0, layer1 = model.model.layers
    assert type(layer0.self_attn.packed_q_k_v.linear.weight).__name__ == "Int8Tensor"
    assert type(layer0.mlp.down_proj.weight).__name__ == "Int8Tensor"
    assert type(layer0.mlp.packed_gate_up.linear.weight) is torch.nn.Parameter  # not in the map
    assert type(layer1.mlp.packed_gate_up.linear.weight) is torch.nn.Parameter  # int4: not built
    assert any("2 Linear layers int8 weight-only" in n for n in notes)
    assert any("1 Linear layer mapped int4 kept fp32: int4 is not built for this torch target (built: int8)" in n
               for n in notes)
    _, got = exported_step(model)
    rel = float((got - want).abs().max() / want.abs().max())
    assert 0 < rel < 0.05, rel


def test_int4_cells_go_to_tinygemm_at_their_block_with_bf16_weights(monkeypatch):
    """On a target that builds int4 (h200-torch), each int4 group becomes one torchao call with the tile-packed
    (tinygemm) layout at the group size tinygemm takes nearest the cell's block from below, its weights bf16 first (the
    layout's requirement); a packed group takes its finest part's block. The CPU cannot run tinygemm's packing, so
    the torchao call is recorded, not made."""
    import torch

    from softsyn.emit import torch_step
    from softsyn.emit.torch_step import WeightCell, pack_projections, quantise_modules, tinygemm_block

    assert [tinygemm_block(b) for b in (16, 32, 48, 64, 128, 200, 256, 1024)] == [32, 32, 32, 64, 128, 128, 256, 256]
    model, _ = _tiny_model()
    pack_projections(model)
    calls = []
    monkeypatch.setattr(torch_step, "quantize_", lambda m, config, filter_fn: calls.append(
        (config, sorted(fqn for fqn, mod in m.named_modules() if filter_fn(mod, fqn)),
         {mod.weight.dtype for fqn, mod in m.named_modules() if filter_fn(mod, fqn)})))
    cells = {"model.layers.0.mlp.gate_proj": WeightCell("int4", 128), "model.layers.0.mlp.up_proj": WeightCell("int4", 64),
             "model.layers.1.mlp.down_proj": WeightCell("int4", 128), "model.layers.1.self_attn.o_proj":
             WeightCell("int8", 0)}
    notes = quantise_modules(model, cells, "fp16", ("int8", "int4")).notes
    by_block = {(type(c).__name__, getattr(c, "group_size", None)): (names, dtypes) for c, names, dtypes in calls}
    assert by_block[("Int4WeightOnlyConfig", 64)] == (["model.layers.0.mlp.packed_gate_up.linear"], {torch.bfloat16})
    assert by_block[("Int4WeightOnlyConfig", 128)] == (["model.layers.1.mlp.down_proj"], {torch.bfloat16})
    assert by_block[("Int8WeightOnlyConfig", None)] == (["model.layers.1.self_attn.o_proj"], {torch.float32})
    assert all(c.int4_packing_format == "tile_packed_to_4d" for c, _, _ in calls if hasattr(c, "int4_packing_format"))
    assert any("1 Linear layer int4 weight-only at block 64 (torchao Int4WeightOnlyConfig)" in n for n in notes)


def test_a_prefill_package_holds_dequantised_weights_only_where_the_area_budget_admits_them():
    """h200-torch's prefill_weights "resident": model-prefill.pt2 holds its int4/fp8 layers dequantised (its own weights,
    beside its program) when the design's area plus what it holds fits area_constraint, and says what that costs;
    over the budget, or with nothing quantised, or on a target that shares, it reads model.pt2's as before."""
    from dataclasses import replace
    from types import SimpleNamespace

    from softsyn.emit.torch_lowering import WEIGHTLESS, WEIGHTS_BESIDE, planned, prefill_residency
    from softsyn.emit.torch_step import WeightCell, quantise_modules
    from softsyn.library.torch_targets import PREFILL_WEIGHTS, TORCH_TARGETS
    from softsyn.runtime.torch_weights import OWN, SHARED
    from softsyn.units import fmt_bytes

    assert all(t.prefill_weights in PREFILL_WEIGHTS for t in TORCH_TARGETS.values())
    target = TORCH_TARGETS["h200-torch"]
    model, _ = packed_tiny()
    area = SimpleNamespace(total=1e6, limit=None)
    assert prefill_residency(target, model, area, keep=True) == (False, None)  # nothing quantised
    quantise_modules(model, {"model.layers.0.self_attn.o_proj": WeightCell("int4", 64),
                             "lm_head": WeightCell("int4", 64)}, "fp32", ("int4",), "softsyn")
    o_proj = model.model.layers[0].self_attn.o_proj
    dense = o_proj.out_features * o_proj.in_features * 4
    floats = sum(t.nbytes for name, t in model.state_dict().items() if name.endswith(("weight", "bias")))
    resident, said = prefill_residency(target, model, area, keep=True)  # the lm_head keeps its kernel and buffers
    held = dense + floats + sum(t.nbytes for t in (model.lm_head.packed, model.lm_head.scales, model.lm_head.lows))
    assert resident and said.startswith(f"model-prefill.pt2 holds its int4/fp8 layers' weights dequantised "
                                        f"({fmt_bytes(dense)}; {fmt_bytes(held)} with a copy")
    assert "no area_constraint" in said
    assert prefill_residency(target, model, SimpleNamespace(total=1e6, limit=1e6 + held), keep=True)[0]
    resident, said = prefill_residency(target, model, SimpleNamespace(total=1e6, limit=1e6 + held - 1), keep=True)
    assert not resident and "does not hold" in said and said.endswith("it dequantises them from model.pt2's at every "
                                                                      "prompt")
    assert prefill_residency(replace(target, prefill_weights="shared"), model, area, keep=True) == (False, None)
    decode, prefill = planned(target, "matmul", resident=True)
    assert (prefill.constants, prefill.weights_config, prefill.resident) == (OWN, WEIGHTS_BESIDE, True)
    assert decode.weights_config == WEIGHTS_BESIDE
    prefill = planned(target, "matmul")[1]
    assert (prefill.constants, prefill.weights_config, prefill.resident) == (SHARED, WEIGHTLESS, False)
    assert o_proj.dense is None and o_proj.packed.numel() > 0  # deciding leaves the model as it was


def test_the_prefill_s_bytes_count_a_torchao_layer_by_the_tensors_it_holds():
    """h200-torch's measured kernel choice may put a torchao int8 layer beside softsyn's int4 ones: its weight, a
    tensor subclass with no storage of its own, counts by its int8 data and scales (asking its storage raised, so the
    compile failed), and the prefill's residency is still decided."""
    from types import SimpleNamespace

    import torch

    from softsyn.emit.torch_lowering import prefill_residency, storage_bytes
    from softsyn.emit.torch_step import WeightCell, quantise_modules
    from softsyn.library.torch_targets import TORCH_TARGETS

    model, _ = packed_tiny()
    quantise_modules(model, {"model.layers.0.self_attn.o_proj": WeightCell("int4", 64)}, "fp32", ("int4",), "softsyn")
    before, dense = storage_bytes(model.state_dict().values()), model.model.layers[1].self_attn.o_proj.weight.nbytes
    quantise_modules(model, {"model.layers.1.self_attn.o_proj": WeightCell("int8", 0)}, "fp32", ("int8",), "torchao")
    weight = model.model.layers[1].self_attn.o_proj.weight
    names, _ = weight.__tensor_flatten__()
    inner = sum(getattr(weight, name).untyped_storage().nbytes() for name in names)
    assert type(weight) is not torch.Tensor and 0 < inner < dense
    assert storage_bytes(model.state_dict().values()) == before - dense + inner
    resident, said = prefill_residency(TORCH_TARGETS["h200-torch"], model, SimpleNamespace(total=1e6, limit=None),
                                       keep=True)
    assert resident and said.startswith("model-prefill.pt2 holds its int4/fp8 layers' weights dequantised")


def test_a_resident_prefill_keeps_its_weights_beside_its_program_when_model_pt2_holds_them_inside():
    """Where this torch made model.pt2 hold its weights inside its .so (no blob to share), a shared prefill package
    takes its own inside too; a resident one already holds its own, beside its program (a multi-GB .so of weights is
    what WEIGHTS_BESIDE avoids), and keeps them there."""
    from pathlib import Path
    from types import SimpleNamespace

    from softsyn.emit.torch_lowering import WEIGHTS_BESIDE, build_packages, planned
    from softsyn.library.torch_targets import TORCH_TARGETS
    from softsyn.runtime.torch_weights import OWN

    def build(design, holder, built, folder, last):
        if built.key == "decode":
            built.weights_config, built.constants = {}, OWN  # compile_package's fallback

    design = SimpleNamespace(torch_target="h200-torch", progress=False)
    for resident, config in ((True, WEIGHTS_BESIDE), (False, {})):
        packages = planned(TORCH_TARGETS["h200-torch"], "matmul", resident=resident)
        build_packages(design, packages, ["model"], Path("unused"), build)
        assert (packages[1].constants, packages[1].weights_config) == (OWN, config)
        assert bool(packages[1].said) is not resident  # the shared one says it now holds its own
