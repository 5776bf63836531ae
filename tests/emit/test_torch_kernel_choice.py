"""The measured int4 kernel choice of the CUDA torch target (softsyn.emit.torch_kernel_choice): the faster form per
layer shape, softsyn's at its fastest tuned config, a form that fails loses and is named, nothing timed off CUDA;
quantise_modules builds what was chosen (the config pinned in the layer) and runtime/torch.json's kernels say so."""
from __future__ import annotations

import torch

from softsyn.emit import torch_step
from softsyn.emit.torch_kernel_choice import CALLS, Pick, WeightShape, choose_weight_kernels, cold_copies, options
from softsyn.emit.torch_step import WeightCell, quantise_modules
from softsyn.emit.triton_weights import QuantLinear


def PLAIN(shape: WeightShape) -> list[Pick]:  # noqa: N802 - the kernels alone, no config timed
    return [Pick("softsyn"), Pick("torchao")]


def _layers(*shapes: WeightShape) -> dict[WeightShape, torch.nn.Linear]:
    return {s: torch.nn.Linear(s.width, s.out, bias=False) for s in shapes}


def test_each_shape_gets_the_faster_kernel_and_the_log_gives_both_times():
    wide, narrow, broken = WeightShape("int4", 64, 512, 32), WeightShape("int8", 256, 64, 32), \
        WeightShape("int4", 128, 128, 32)
    table = {(wide, "softsyn"): 10e-6, (wide, "torchao"): 20e-6, (narrow, "softsyn"): 9e-6, (narrow, "torchao"): 7e-6}
    built = []

    def build(pick, linear, shape):
        assert (linear.in_features, linear.out_features) == (shape.width, shape.out)
        if shape == broken and pick.kernel == "softsyn":
            raise RuntimeError("PTX too new\nsecond line")
        built.append((pick.kernel, shape))
        return (shape, pick.kernel)

    def timer(layers, width, dtype, device):
        layer = layers[0]
        assert device == "cuda" and dtype == torch.float16 and width == layer[0].width
        assert len(layers) == {wide: 9, narrow: 9, broken: 17}[layer[0]] and all(copy == layer for copy in layers)
        return table.get((layer[0], layer[1]), 5e-6)

    # wide's and narrow's codes take 16 KiB, broken's 8: a 64 KiB cache wants 128 KiB of others between two calls of
    # one copy, 8 (16) others
    chosen, notes = choose_weight_kernels(_layers(wide, narrow, broken), build, torch.float16, "cuda", timer,
                                          cache=64 * 1024, forms=PLAIN)
    assert chosen == {wide: Pick("softsyn"), narrow: Pick("torchao"), broken: Pick("torchao")}
    assert notes[0] == (f"kernel for int4 64->512 block 32: softsyn (softsyn 10.0 us, torchao 20.0 us a one-row call, "
                        f"{CALLS} calls a CUDA graph over 9 copies, measured)")
    assert notes[1].startswith("kernel for int8 256->64 block 32: torchao (softsyn 9.0 us, torchao 7.0 us")
    assert notes[2].startswith("kernel for int4 128->128 block 32: torchao (torchao 5.0 us, softsyn did not run "
                               "(RuntimeError: PTX too new)")


def test_a_form_that_faults_the_device_stops_the_choice_naming_it(monkeypatch):
    """A form whose call leaves the CUDA context unusable stops the choice with a defect naming the form and shape,
    as the attention choice does (softsyn.emit.torch_kernel_choice.stop_if_faulted)."""
    import pytest

    from softsyn.errors import SoftsynDefect

    shape = WeightShape("int4", 64, 64, 64)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def synchronize():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)

    def fails(pick, linear, block):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(SoftsynDefect, match=r"^weight kernel softsyn.* for int4 64->64 block 64: the device faulted"):
        choose_weight_kernels(_layers(shape), fails, torch.float16, "cuda", lambda *a: 1.0, cache=0, forms=PLAIN)


def test_cold_copies_keep_every_call_out_of_the_cache():
    assert cold_copies(16 * 1024, 64 * 1024) == 9  # 8 others of 16 KiB between two calls: twice the cache
    assert cold_copies(155_582_464, 50 * 2**20) == 2  # an lm_head larger than the cache: one other suffices
    assert cold_copies(4096, 50 * 2**20) == CALLS  # never more copies than calls
    assert WeightShape("int4", 2048, 4096, 32).weight_bytes() == 2048 * 4096 // 2
    assert WeightShape("int8", 2048, 4096, 0).weight_bytes() == 2048 * 4096


def test_a_tie_goes_to_softsyn_and_a_shape_no_form_runs_keeps_torchao():
    shape = WeightShape("int4", 64, 64, 64)
    chosen, _ = choose_weight_kernels(_layers(shape), lambda p, lin, b: p, torch.float16, "cuda",
                                      lambda layers, w, d, dev: 3e-6, cache=0)
    assert chosen == {shape: Pick("softsyn", 0)}  # a tie: the first of softsyn's configs

    def fails(pick, linear, block):
        raise ValueError(pick.kernel)

    chosen, notes = choose_weight_kernels(_layers(shape), fails, torch.float16, "cuda", lambda *a: 1.0, cache=0)
    assert chosen == {shape: Pick("torchao")} and "softsyn at" in notes[0] and "torchao did not run" in notes[0]
    assert notes[0].count("did not run") == 2  # softsyn's other configs are not tried after its first failed


def test_softsyn_s_kernel_is_pinned_at_its_fastest_tuned_config_and_fp8_is_timed_alone():
    """softsyn's form is timed at each tuned config of the precision (int4: ASM's three), the fastest pinned; fp8,
    softsyn's only, is timed at its own configs and offered no torchao layer; the log names each config."""
    int4, fp8 = WeightShape("int4", 64, 64, 32), WeightShape("fp8", 64, 64, 32)
    assert [p.kernel for p in options(int4)] == ["softsyn"] * 3 + ["torchao"]
    assert [p.kernel for p in options(fp8)] == ["softsyn"] * 4
    speed = {Pick("softsyn", 0): 9e-6, Pick("softsyn", 1): 6e-6, Pick("softsyn", 2): 8e-6, Pick("torchao"): 7e-6,
             Pick("softsyn", 3): 5e-6}
    chosen, notes = choose_weight_kernels(_layers(int4, fp8), lambda p, lin, s: p, torch.float16, "cuda",
                                          lambda layers, w, d, dev: speed[layers[0]], cache=0)
    assert chosen == {int4: Pick("softsyn", 1), fp8: Pick("softsyn", 3)}
    assert notes[0].startswith("kernel for int4 64->64 block 32: softsyn at 2 x 1024 bytes, 2 warps, ASM (softsyn at "
                               "1 x 1024 bytes, 1 warp, ASM 9.0 us, softsyn at 2 x 1024 bytes, 2 warps, ASM 6.0 us, ")
    assert "torchao" not in notes[1] and "softsyn at 2 x 512 bytes, 1 warp, F16 5.0 us" in notes[1]


def test_nothing_is_timed_off_cuda():
    shape = WeightShape("int8", 64, 64, 32)

    def never(*args):
        raise AssertionError("timed on the CPU")

    fp8 = WeightShape("fp8", 64, 64, 32)
    chosen, notes = choose_weight_kernels(_layers(shape, fp8), never, torch.float32, "cpu", never)
    assert chosen == {shape: Pick("torchao"), fp8: Pick("softsyn")}
    assert notes == ["weight kernels not measured (no CUDA device): torchao's (fp8: softsyn's, autotuned)"]


def test_a_measured_map_builds_each_layer_with_its_shape_s_kernel(monkeypatch):
    """quantise_modules with weight_kernel "measured": the packed gate/up int4 shape measured faster on softsyn's
    kernel (timed gated: the MLP's activation in its epilogue) becomes an int4 QuantLinear, layer 0's int8 down_proj (torchao faster) a torchao int8 call, layer 1's int8
    down_proj (softsyn faster) an int8 QuantLinear, the fp8 o_proj softsyn's without a measurement; the kernels name
    every cell's."""
    from tests.emit.test_torch_lowering import packed_tiny

    model, _ = packed_tiny()
    asked = {}
    layer0, layer1 = model.model.layers
    softsyn_faster = {(layer0.mlp.packed_gate_up.linear.in_features, layer0.mlp.packed_gate_up.linear.out_features)}

    def choose(layers, build, dtype, device):
        asked.update(layers)
        return {s: Pick("softsyn", 1) if (s.width, s.out) in softsyn_faster or s.block == 64 or s.precision == "fp8"
                else Pick("torchao") for s in layers}, ["measured line"]

    calls = []
    monkeypatch.setattr(torch_step, "choose_weight_kernels", choose)
    monkeypatch.setattr(torch_step, "quantize_", lambda m, config, filter_fn: calls.append(
        (type(config).__name__, sorted(fqn for fqn, mod in m.named_modules() if filter_fn(mod, fqn)))))
    cells = {"model.layers.0.mlp.gate_proj": WeightCell("int4", 32), "model.layers.0.mlp.up_proj": WeightCell("int4", 32),
             "model.layers.0.mlp.down_proj": WeightCell("int8", 32), "model.layers.1.mlp.down_proj":
             WeightCell("int8", 64), "model.layers.1.self_attn.o_proj": WeightCell("fp8", 0)}
    notes, kernels = quantise_modules(model, cells, "fp32", ("int8", "int4", "fp8"), "measured")
    gate_up = layer0.mlp.packed_gate_up.linear
    down = (layer0.mlp.down_proj.in_features, layer0.mlp.down_proj.out_features)
    o_proj = (layer1.self_attn.o_proj.in_features, layer1.self_attn.o_proj.out_features)
    assert set(asked) == {WeightShape("int4", gate_up.in_features, gate_up.out_features, 32, gated=True),
                          WeightShape("int8", *down, 32), WeightShape("int8", *down, 64),
                          WeightShape("fp8", *o_proj, 0)}  # fp8: its config measured
    assert isinstance(gate_up, QuantLinear) and gate_up.precision == "int4" and gate_up.config == 1
    assert isinstance(layer1.mlp.down_proj, QuantLinear) and layer1.mlp.down_proj.precision == "int8"
    assert layer1.self_attn.o_proj.precision == "fp8" and layer1.self_attn.o_proj.config == 1
    assert calls == [("Int8WeightOnlyConfig", ["model.layers.0.mlp.down_proj"])]
    assert kernels == {"model.layers.0.mlp.gate_proj": "softsyn", "model.layers.0.mlp.up_proj": "softsyn",
                       "model.layers.0.mlp.down_proj": "torchao", "model.layers.1.mlp.down_proj": "softsyn",
                       "model.layers.1.self_attn.o_proj": "softsyn"}
    assert notes[0] == "measured line"


def test_a_layer_no_group_divides_stays_float_and_says_so():
    """softsyn's kernel takes groups of 32, 64 or 128 inputs: a 48-wide fp8 layer is kept at the float precision,
    named in a note and absent from the kernels; a 64-wide one beside it is built."""
    model = torch.nn.ModuleDict({"narrow": torch.nn.Linear(48, 8), "wide": torch.nn.Linear(64, 8)})
    cells = {"narrow": WeightCell("fp8", 0), "wide": WeightCell("fp8", 0)}
    notes, kernels = quantise_modules(model, cells, "fp32", ("fp8",), "measured")
    assert kernels == {"wide": "softsyn"}
    assert isinstance(model["wide"], QuantLinear) and type(model["narrow"]) is torch.nn.Linear
    assert notes[0].startswith("weight kernels not measured (no CUDA device)")  # fp8's config: autotuned
    assert notes[1] == "48-wide Linear mapped fp8 kept fp32: no group of (32, 64, 128) divides its input width"
    assert notes[2].startswith("1 Linear layer fp8 weight-only at group ") and "autotuned" in notes[2]


def test_a_packed_gate_up_is_timed_in_its_gated_form_at_its_config():
    """The measured choice builds a packed gate/up as the gated GEMV (GatedGemv at the config timed), a plain layer
    as the QuantLinear; the log says which shape was gated."""
    GatedGemv, quant_layer = torch_step.GatedGemv, torch_step.quant_layer
    gated, plain = WeightShape("int4", 64, 96, 32, gated=True), WeightShape("int4", 64, 96, 32)
    probe = quant_layer(Pick("softsyn", 2), torch.nn.Linear(64, 96, bias=False), gated)
    assert isinstance(probe, GatedGemv) and probe.layer.config == 2
    layer = quant_layer(Pick("softsyn", 1), torch.nn.Linear(64, 96, bias=False), plain)
    assert isinstance(layer, QuantLinear) and layer.config == 1
    x = torch.randn(3, 64)
    gate, up = layer(x).chunk(2, dim=-1)  # off CUDA both run the dequantised product
    assert torch.allclose(GatedGemv(layer)(x), torch.nn.functional.silu(gate) * up, atol=1e-5)
    assert gated.label() == "int4 64->96 block 32 gated"


def test_torchao_s_form_of_a_gated_shape_is_timed_with_its_activation():
    """torchao's layer of a packed gate/up is timed with silu(gate) * up after it (the kernel a package runs after
    it, which softsyn's gated GEMV computes in its epilogue); a plain shape's is the layer alone."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=False)
    gated = torch_step.quant_layer(Pick("torchao"), linear, WeightShape("int8", 64, 96, 0, gated=True))
    plain = torch_step.quant_layer(Pick("torchao"), linear, WeightShape("int8", 64, 96, 0))
    assert isinstance(gated, torch_step.ActivatedLayer) and not isinstance(plain, torch_step.ActivatedLayer)
    x = torch.randn(3, 64)
    gate, up = plain(x).chunk(2, dim=-1)
    torch.testing.assert_close(gated(x), torch.nn.functional.silu(gate) * up)


def test_only_a_packed_gate_and_up_are_timed_gated():
    """A Linear realising both a gate_proj and an up_proj cell (packed) is a gated shape; an unpacked gate_proj, or a
    packed QKV, is not."""
    linear = torch.nn.Linear(64, 96, bias=False)
    mlp = "model.layers.0.mlp."
    packed = torch_step.Wanted(linear, [mlp + "gate_proj", mlp + "up_proj"], "int4", 32, "measured")
    alone = torch_step.Wanted(linear, [mlp + "gate_proj"], "int4", 32, "measured")
    qkv = torch_step.Wanted(linear, [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"], "int4", 32, "measured")
    assert packed.shape().gated and not alone.shape().gated and not qkv.shape().gated
