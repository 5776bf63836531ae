"""The measured decode attention choice of the CUDA torch target (softsyn.emit.torch_attention_choice): the form whose
chains sum least over the decode groups' spans, a form that fails loses and is named, nothing timed off CUDA or
without a decode group; the shapes come from the decode groups, spans rounded as the runner rounds them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from softsyn.emit.torch_attention_choice import FORMS, MEASURED_FORM, AttentionShape, choose_attention, decode_shapes
from softsyn.emit.torch_kernel_choice import CALLS
from softsyn.emit.torch_step import ATTENTIONS
from softsyn.library.torch_targets import TORCH_TARGETS


def _group(**dims):
    return SimpleNamespace(scenario=SimpleNamespace(dims=dims))


def test_decode_groups_give_their_spans_and_other_groups_none():
    config = SimpleNamespace(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                             hidden_size=2048)
    groups = [_group(batch=1, seq=1, past=512), _group(batch=1, seq=512, past=0), _group(batch=1, seq=1, past=4096),
              _group(batch=1, seq=1, past=600), _group(batch=4, seq=1, past=512), _group(batch=1, seq=1, past=5000)]
    shapes = decode_shapes(groups, config, 4160)
    # past 512 and 600 both read 768 slots (one shape); 4096 reads the cache's 4160; past 5000 is beyond the cache
    assert shapes == [AttentionShape(1, 16, 8, 128, 768, 4160), AttentionShape(1, 16, 8, 128, 4160, 4160),
                      AttentionShape(4, 16, 8, 128, 768, 4160)]
    assert shapes[0].kv_bytes(2) == 2 * 8 * 768 * 128 * 2
    # no kv heads, no head_dim: MHA of 64
    gqa_free = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=256)
    assert decode_shapes([_group(seq=1, past=10)], gqa_free, 64) == [AttentionShape(1, 4, 4, 64, 64, 64)]


def test_the_form_with_the_least_summed_time_wins_and_the_log_gives_every_time():
    short, long = AttentionShape(1, 16, 8, 128, 768), AttentionShape(1, 16, 8, 128, 4160)
    table = {("matmul", short): 9e-6, ("matmul", long): 19e-6, ("softsyn", short): 10e-6, ("softsyn", long): 8e-6}
    asked = []

    def timer(form, shape, dtype, device):
        asked.append((form, shape))
        assert dtype == torch.float16 and device == "cuda"
        return table[form, shape]

    chosen, lines = choose_attention([short, long], torch.float16, "cuda", timer)
    assert chosen == "softsyn" and asked == [(f, s) for f in FORMS for s in (short, long)]
    assert lines[0] == "decode attention: softsyn (the fastest of matmul, softsyn)"
    assert lines[1] == (f"decode attention matmul: 9.0 us a layer at batch 1, 16/8 heads of 128, span 768, 19.0 us a "
                        f"layer at batch 1, 16/8 heads of 128, span 4160 ({CALLS} calls a CUDA graph, measured)")
    assert all(form in ATTENTIONS for form in FORMS)


def test_a_form_that_fails_loses_a_tie_goes_to_the_first_and_nothing_is_timed_off_cuda():
    shape = AttentionShape(1, 2, 1, 64, 256)

    def broken(form, shape, dtype, device):
        if form == "softsyn":
            raise RuntimeError("Failed to run autotuning code block\nsecond line")
        return 5e-6

    chosen, lines = choose_attention([shape], torch.float16, "cuda", broken)
    assert chosen == "matmul"
    assert lines[-1] == ("decode attention softsyn: did not run (RuntimeError: Failed to run autotuning code block)")
    assert choose_attention([shape], torch.float16, "cuda", lambda *a: 3e-6)[0] == FORMS[0]

    def never(*args):
        raise AssertionError("timed off CUDA")

    assert choose_attention([shape], torch.float32, "cpu", never) == (
        "matmul", ["decode attention not measured (no CUDA device): matmul"])
    assert choose_attention([], torch.float16, "cuda", never) == (
        "matmul", ["decode attention not measured (no decode path group): matmul"])


def test_every_torch_target_names_a_form_or_the_measured_choice():
    for target in TORCH_TARGETS.values():
        assert target.attention in ATTENTIONS or target.attention == MEASURED_FORM, target.name
        assert target.prefill_attention in (None, *ATTENTIONS), target.name
    assert TORCH_TARGETS["h200-torch"].attention == MEASURED_FORM


def test_a_measured_form_aotinductor_cannot_package_is_built_again_in_the_matmul_form(capsys):
    """The compile measured softsyn's attention fastest and AOTInductor then failed on it (qwen3-1.7b's int4 package,
    H100, 2026-12-06): model.pt2 is built again in the matmul form, the prefill package still follows, and the reason
    is in the package's notes and on stderr at once. A form the target names itself, or a failure once the model is
    dropped (nothing left to rebuild from), stands."""
    from pathlib import Path
    from types import SimpleNamespace

    from softsyn.emit.torch_lowering import build_packages, planned
    from softsyn.library.torch_targets import TORCH_TARGETS

    calls = []

    def build(design, holder, built, folder, last):
        calls.append((built.file, built.attention, last))
        if built.attention == "softsyn":
            raise RuntimeError("Failed to run autotuning code block: Name=attend_kernel")

    design = SimpleNamespace(torch_target="h200-torch", progress=True)
    packages = planned(TORCH_TARGETS["h200-torch"], "softsyn")
    build_packages(design, packages, ["model"], Path("unused"), build)
    assert calls == [("model.pt2", "softsyn", False), ("model.pt2", "matmul", False),
                     ("model-prefill.pt2", "sdpa", True)]
    assert packages[0].attention == "matmul"
    said = "model.pt2: AOTInductor failed on the measured softsyn attention (RuntimeError: Failed to run autotuning"
    assert packages[0].said[-1].startswith(said) and packages[0].said[-1].endswith("built in matmul attention instead")
    assert said in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="attend_kernel"):  # cpu-torch names its form: no measured choice to undo
        build_packages(SimpleNamespace(torch_target="cpu-torch", progress=False),
                       planned(TORCH_TARGETS["cpu-torch"], "softsyn"), ["model"], Path("unused"), build)
    with pytest.raises(RuntimeError, match="attend_kernel"):  # the model already dropped
        build_packages(design, planned(TORCH_TARGETS["h200-torch"], "softsyn"), [], Path("unused"), build)
