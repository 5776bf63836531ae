"""The measured int4 kernel choice of the CUDA torch target (softsyn.emit.torch_kernel_choice): the faster form per
layer shape, a form that fails loses and is named, nothing timed off CUDA; quantise_modules builds what was chosen and
runtime/torch.json's kernels say so."""
from __future__ import annotations

import torch

from softsyn.emit import torch_step
from softsyn.emit.torch_kernel_choice import CALLS, Int4Shape, choose_int4_kernels
from softsyn.emit.torch_step import WeightCell, pack_projections, quantise_modules
from softsyn.emit.triton_weights import QuantLinear


def _layers(*shapes: Int4Shape) -> dict[Int4Shape, torch.nn.Linear]:
    return {s: torch.nn.Linear(s.width, s.out, bias=False) for s in shapes}


def test_each_shape_gets_the_faster_kernel_and_the_log_gives_both_times():
    wide, narrow, broken = Int4Shape(64, 512, 32), Int4Shape(256, 64, 32), Int4Shape(128, 128, 32)
    table = {(wide, "softsyn"): 10e-6, (wide, "torchao"): 20e-6, (narrow, "softsyn"): 9e-6, (narrow, "torchao"): 7e-6}
    built = []

    def build(kernel, linear, block):
        shape = Int4Shape(linear.in_features, linear.out_features, block)
        if shape == broken and kernel == "softsyn":
            raise RuntimeError("PTX too new\nsecond line")
        built.append((kernel, shape))
        return (shape, kernel)

    def timer(layer, width, dtype, device):
        assert device == "cuda" and dtype == torch.float16 and width == layer[0].width
        return table.get((layer[0], layer[1]), 5e-6)

    chosen, notes = choose_int4_kernels(_layers(wide, narrow, broken), build, torch.float16, "cuda", timer)
    assert chosen == {wide: "softsyn", narrow: "torchao", broken: "torchao"}
    assert notes[0] == (f"int4 kernel for 64->512 block 32: softsyn (softsyn 10.0 us, torchao 20.0 us a one-row call, "
                        f"{CALLS} calls a CUDA graph, measured)")
    assert notes[2].startswith("int4 kernel for 128->128 block 32: torchao (torchao 5.0 us, softsyn did not run "
                               "(RuntimeError: PTX too new)")


def test_a_tie_goes_to_softsyn_and_a_shape_no_form_runs_keeps_torchao():
    shape = Int4Shape(64, 64, 64)
    chosen, _ = choose_int4_kernels(_layers(shape), lambda k, lin, b: k, torch.float16, "cuda",
                                    lambda layer, w, d, dev: 3e-6)
    assert chosen == {shape: "softsyn"}

    def fails(kernel, linear, block):
        raise ValueError(kernel)

    chosen, notes = choose_int4_kernels(_layers(shape), fails, torch.float16, "cuda", lambda *a: 1.0)
    assert chosen == {shape: "torchao"} and "softsyn did not run" in notes[0] and "torchao did not run" in notes[0]


def test_nothing_is_timed_off_cuda():
    shape = Int4Shape(64, 64, 32)

    def never(*args):
        raise AssertionError("timed on the CPU")

    chosen, notes = choose_int4_kernels(_layers(shape), never, torch.float32, "cpu", never)
    assert chosen == {shape: "torchao"} and notes == ["int4 kernels not measured (no CUDA device): torchao's"]


def test_a_measured_map_builds_each_layer_with_its_shape_s_kernel(monkeypatch):
    """quantise_modules with int4_kernel "measured": the packed gate/up shape measured faster on softsyn's kernel
    becomes a QuantLinear, down_proj's shape (torchao faster) a torchao call; the kernels name every cell's."""
    from tests.emit.test_torch_lowering import _tiny_model

    model, _ = _tiny_model()
    pack_projections(model)
    asked = {}

    def choose(layers, build, dtype, device):
        asked.update(layers)
        return {s: "softsyn" if s.out > s.width else "torchao" for s in layers}, ["measured line"]

    calls = []
    monkeypatch.setattr(torch_step, "choose_int4_kernels", choose)
    monkeypatch.setattr(torch_step, "quantize_", lambda m, config, filter_fn: calls.append(
        sorted(fqn for fqn, mod in m.named_modules() if filter_fn(mod, fqn))))
    cells = {"model.layers.0.mlp.gate_proj": WeightCell("int4", 32), "model.layers.0.mlp.up_proj": WeightCell("int4", 32),
             "model.layers.0.mlp.down_proj": WeightCell("int4", 32)}
    notes, kernels = quantise_modules(model, cells, "fp32", ("int8", "int4"), "measured")
    mlp = model.model.layers[0].mlp
    gate_up = Int4Shape(mlp.packed_gate_up.linear.in_features, mlp.packed_gate_up.linear.out_features, 32)
    assert set(asked) == {gate_up, Int4Shape(mlp.down_proj.in_features, mlp.down_proj.out_features, 32)}
    assert isinstance(mlp.packed_gate_up.linear, QuantLinear)
    assert calls == [["model.layers.0.mlp.down_proj"]]
    assert kernels == {"model.layers.0.mlp.gate_proj": "softsyn", "model.layers.0.mlp.up_proj": "softsyn",
                       "model.layers.0.mlp.down_proj": "torchao"}
    assert notes[0] == "measured line"
