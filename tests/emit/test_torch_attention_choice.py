"""The measured decode attention choice of the CUDA torch target (softsyn.emit.torch_attention_choice): the form whose
chains sum least over the decode groups' spans, a form that fails loses and is named, nothing timed off CUDA or
without a decode group; the shapes come from the decode groups, spans rounded as the runner rounds them."""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from softsyn.emit.torch_attention_choice import (FORMS, MEASURED_FORM, PLAIN, PROLOGUE, PROLOGUES, AttentionShape,
                                                  Candidate, attention_timing, choose_attention, core_seconds, decode_shapes,
                                                  module_step)
from softsyn.emit.torch_kernel_choice import CALLS
from softsyn.emit.torch_prologue import PROLOGUE_SETTINGS
from softsyn.emit.torch_attention_forms import ATTENTIONS, attention_implementation
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

    def timer(candidate, shape, dtype, device):
        asked.append((candidate.form, shape))
        assert dtype == torch.float16 and device == "cuda" and not candidate.prologue
        return table[candidate.form, shape]

    chosen, lines = choose_attention([short, long], torch.float16, "cuda", timer)
    assert chosen == Candidate("softsyn") and asked == [(f, s) for f in FORMS for s in (short, long)]
    assert lines[0] == "decode attention: softsyn (the fastest of matmul, softsyn)"
    assert lines[1] == (f"decode attention matmul: 9.0 us a layer at batch 1, 16/8 heads of 128, span 768, 19.0 us a "
                        f"layer at batch 1, 16/8 heads of 128, span 4160 ({CALLS} calls a CUDA graph, measured)")
    assert all(form in ATTENTIONS for form in FORMS)


def test_a_form_that_fails_loses_a_tie_goes_to_the_first_and_nothing_is_timed_off_cuda():
    shape = AttentionShape(1, 2, 1, 64, 256)

    def broken(candidate, shape, dtype, device):
        if candidate.form == "softsyn":
            raise RuntimeError("Failed to run autotuning code block\nsecond line")
        return 5e-6

    chosen, lines = choose_attention([shape], torch.float16, "cuda", broken)
    assert chosen == Candidate("matmul")
    assert lines[-1] == ("decode attention softsyn: did not run (RuntimeError: Failed to run autotuning code block)")
    assert choose_attention([shape], torch.float16, "cuda", lambda *a: 3e-6)[0] == Candidate(FORMS[0])

    def never(*args):
        raise AssertionError("timed off CUDA")

    assert choose_attention([shape], torch.float32, "cpu", never) == (
        Candidate("matmul"), ["decode attention not measured (no CUDA device): matmul"])
    assert choose_attention([], torch.float16, "cuda", never) == (
        Candidate("matmul"), ["decode attention not measured (no decode path group): matmul"])


def test_a_candidate_that_faults_the_device_stops_the_choice_naming_it(monkeypatch):
    """A candidate whose chain leaves the CUDA context unusable (an illegal address: every later CUDA call fails) is
    not a loser like any other: the choice stops with a defect (exit 3) that names it, not at the next CUDA call
    elsewhere; a failure that leaves the device usable still just loses."""
    from softsyn.errors import SoftsynDefect

    shape = AttentionShape(1, 2, 1, 64, 256)
    faulted = {"now": False}

    def synchronize():
        if faulted["now"]:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)

    def faulting(candidate, shape, dtype, device):
        if candidate.form == "softsyn":
            faulted["now"] = True
            raise RuntimeError("CUDA driver error: an illegal memory access was encountered")
        return 5e-6

    with pytest.raises(SoftsynDefect, match=r"^decode attention candidate softsyn: the device faulted while it ran "
                                            r"\(RuntimeError: CUDA driver error: an illegal memory access"):
        choose_attention([shape], torch.float16, "cuda", faulting)
    faulted["now"] = False

    def losing(candidate, shape, dtype, device):
        if candidate.form == "softsyn":
            raise RuntimeError("out of resources")
        return 5e-6

    assert choose_attention([shape], torch.float16, "cuda", losing)[0] == Candidate("matmul")


def test_the_fused_prologue_is_a_candidate_that_wins_only_when_faster():
    """With the prologue a candidate, it is chosen where its chains sum least and named in the log; a tie goes to the
    earlier candidate (softsyn's form without it)."""
    shape = AttentionShape(1, 16, 8, 128, 768)
    times = {Candidate("matmul"): 30e-6, Candidate("softsyn"): 28e-6, PROLOGUE: 24e-6}
    candidates = PLAIN + (PROLOGUE,)
    chosen, lines = choose_attention([shape], torch.float16, "cuda", lambda c, *a: times[c], candidates)
    assert chosen == PROLOGUE and chosen.form == "softsyn"
    assert lines[0] == ("decode attention: softsyn + fused prologue (the fastest of matmul, softsyn, softsyn + fused "
                        "prologue)")
    assert lines[3].startswith("decode attention softsyn + fused prologue: 24.0 us a layer at batch 1")
    times[PROLOGUE] = 28e-6
    assert choose_attention([shape], torch.float16, "cuda", lambda c, *a: times[c],
                            candidates)[0] == Candidate("softsyn")

    def failing(*args):
        raise RuntimeError("dynamo could not trace the module")

    chosen, lines = choose_attention([shape], torch.float16, "cuda", failing, candidates,
                                     fallback=lambda c, *a: times[c])
    assert chosen == Candidate("softsyn") and len(lines) == 7  # the three that failed, then PLAIN's two, timed again
    assert lines[4] == "decode attention: no candidate ran; each form's attention function timed instead"


def _packed_tiny():
    from softsyn.emit.torch_step import cast_parameters, pack_projections
    from softsyn.frontends import source_torch_model

    model = source_torch_model("zoo:qwen3-tiny").eval()
    cast_parameters(model, torch.float32)
    pack_projections(model)
    return model


def test_where_torch_compile_fails_on_a_candidate_every_candidate_is_timed_as_aotinductor_packages():
    """torch 2.11's Inductor failed every module chain holding softsyn's Triton ops while AOTInductor packaged them
    (H100, 2026-12-07): where the chains' timer fails on a candidate, every candidate is timed by the packaged timer
    (like for like), the lines saying so and why, the fastest package winning; one that fails as a package too loses
    with its reason. torch.compile's pass times the candidates holding softsyn's ops first and stops at the first
    failure: what it timed before would be timed again as packages."""
    shape = AttentionShape(1, 16, 8, 128, 768)
    candidates = PLAIN + (PROLOGUE,)
    compiled_times = {Candidate("matmul"): 20e-6, PROLOGUE: 26e-6}
    packaged_times = {Candidate("matmul"): 30e-6, PROLOGUE: 24e-6}
    packaged_asked = []

    compiled_asked = []

    def compiled(candidate, *args):
        compiled_asked.append(candidate)
        if candidate.form == "softsyn":
            raise KeyError("op14")
        return compiled_times[candidate]

    def packaged(candidate, *args):
        packaged_asked.append(candidate)
        if candidate == Candidate("softsyn"):
            raise RuntimeError("export failed\nsecond line")
        return packaged_times[candidate]

    chosen, lines = choose_attention([shape], torch.float16, "cuda", compiled, candidates, packaged=packaged)
    assert chosen == PROLOGUE and packaged_asked == list(candidates)
    assert compiled_asked == [Candidate("softsyn")]  # the Triton ops' candidates first; none after the failure
    assert lines[0] == "decode attention: softsyn + fused prologue (the fastest of matmul, softsyn + fused prologue)"
    assert lines[1] == ("decode attention: torch.compile failed on softsyn (KeyError: 'op14'): every candidate timed "
                        "as AOTInductor packages")
    assert lines[2].startswith("decode attention matmul: 30.0 us a layer at batch 1")
    assert lines[2].endswith("measured; as AOTInductor packages, built in 0 s)")
    assert lines[3] == "decode attention softsyn, as AOTInductor packages: did not run (RuntimeError: export failed)"
    assert lines[4].startswith("decode attention softsyn + fused prologue: 24.0 us a layer")


def test_where_torch_compile_runs_every_candidate_no_package_is_built():
    """Packages cost 20-40 s each on the H100: built only where torch.compile fails on a candidate."""
    shape = AttentionShape(1, 16, 8, 128, 768)

    def packaged(candidate, *args):
        raise AssertionError("no package wanted")

    chosen, lines = choose_attention([shape], torch.float16, "cuda", lambda c, *a: 10e-6 if c.form == "matmul"
                                     else 20e-6, PLAIN, packaged=packaged)
    assert chosen == Candidate("matmul") and not any("packages" in line for line in lines)


def test_a_packaged_module_step_computes_the_eager_step_at_every_span_and_writes_its_cache():
    """What the packaged timer calls: a layer's attention module step (the matmul form, on the CPU here) exported once
    and compiled by AOTInductor gives the eager step's output at two spans (the span is the package's dynamic dim, so
    one package times every decode group) and writes the same key and value slot of the cache it is given."""
    from softsyn.emit.torch_attention_choice import packaged_step

    model = _packed_tiny()
    module, rotary = model.model.layers[1].self_attn, model.model.rotary_emb
    kv, dim = model.config.num_key_value_heads, model.config.head_dim
    shapes = [AttentionShape(1, model.config.num_attention_heads, kv, dim, span=s, length=16) for s in (12, 7)]
    torch.manual_seed(0)
    caches = [torch.randn(2, 1, kv, 16, dim) for _ in range(2)]
    copies, start = [c.clone() for c in caches], torch.stack(caches).clone()
    got, want = [], []
    with attention_implementation(module, ATTENTIONS["matmul"][0]), torch.no_grad(), \
            tempfile.TemporaryDirectory() as folder:
        example = module_step(module, rotary, Candidate("matmul"), replace(shapes[0], span=10), caches, calls=1)
        step = packaged_step(module, example[0], example[1][0], Path(folder) / "chain.pt2")
        for shape in shapes:
            one, calls = module_step(module, rotary, Candidate("matmul"), shape, caches, calls=2)
            got += [step(*args) for args in calls]
            want += [one(args[0], *copies[i % len(copies)], *args[3:]) for i, args in enumerate(calls)]  # eager
    got = [g[0] if isinstance(g, (list, tuple)) else g for g in got]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.stack(caches), torch.stack(copies), rtol=1e-5, atol=1e-5)
    written = torch.stack(caches) != start  # slot span - 2 of each copy at each span (10 and 5), nothing else
    slots = written.any(dim=-1).flatten(0, -2).any(dim=0)
    assert slots.nonzero().flatten().tolist() == [5, 10]


def test_each_candidate_s_module_chain_computes_the_same_steps():
    """What the choice times: a layer's attention module over a chain of caches, in each form and with the fused
    prologue, gives the same outputs and writes the same keys and values (the chains run eagerly on the CPU here;
    compiled and captured as a CUDA graph on the device)."""
    model = _packed_tiny()
    timing = attention_timing(model, prologue=True)
    candidates = timing.candidates
    assert candidates == PLAIN + PROLOGUES and timing.what == "a layer's attention module"
    assert timing.timer is not core_seconds and timing.fallback is core_seconds
    assert attention_timing(model, prologue=False).candidates == PLAIN
    module, rotary = model.model.layers[1].self_attn, model.model.rotary_emb
    kv, dim = model.config.num_key_value_heads, model.config.head_dim
    shape = AttentionShape(2, model.config.num_attention_heads, kv, dim, span=12, length=16)
    results = []
    for candidate in candidates:
        torch.manual_seed(0)
        caches = [tuple(torch.randn(2, kv, 16, dim) for _ in range(2)) for _ in range(3)]  # cold_caches' form
        start = torch.stack([torch.stack(c) for c in caches])
        with attention_implementation(module, ATTENTIONS[candidate.form][0]), torch.no_grad():
            one, calls = module_step(module, rotary, candidate, shape, caches, calls=4)
            outs = [one(*args) for args in calls]
        results.append((torch.stack(outs), torch.stack([torch.stack(c) for c in caches])))
    for outs, caches in results[1:]:
        torch.testing.assert_close(outs, results[0][0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(caches, results[0][1], rtol=1e-5, atol=1e-5)
    written = results[0][1] != start  # the same seed: every candidate started from these caches
    assert written[:, :, :, :, 10].all() and not written[:, :, :, :, :10].any() and not written[:, :, :, :, 11:].any()


def test_every_torch_target_names_a_form_or_the_measured_choice():
    for target in TORCH_TARGETS.values():
        assert target.attention in ATTENTIONS or target.attention == MEASURED_FORM, target.name
        assert target.prefill_attention in (None, *ATTENTIONS), target.name
    assert TORCH_TARGETS["h200-torch"].attention == MEASURED_FORM
    for target in TORCH_TARGETS.values():  # the prologue is measured as a candidate of the measured attention only
        assert target.fused_prologue in PROLOGUE_SETTINGS, target.name
        assert target.fused_prologue != "measured" or target.attention == MEASURED_FORM, target.name


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
                     ("model-prefill.pt2", "prompt", False)]  # the model kept: the prompt form has a fallback
    assert packages[0].attention == "matmul"
    said = "model.pt2: AOTInductor failed on the softsyn attention (RuntimeError: Failed to run autotuning"
    assert packages[0].said[-1].startswith(said) and packages[0].said[-1].endswith("built in matmul attention instead")
    assert said in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="attend_kernel"):  # cpu-torch names its form: no measured choice to undo
        build_packages(SimpleNamespace(torch_target="cpu-torch", progress=False),
                       planned(TORCH_TARGETS["cpu-torch"], "softsyn"), ["model"], Path("unused"), build)
    with pytest.raises(RuntimeError, match="attend_kernel"):  # the model already dropped
        build_packages(design, planned(TORCH_TARGETS["h200-torch"], "softsyn"), [], Path("unused"), build)


def test_a_prompt_form_aotinductor_cannot_package_is_built_again_in_sdpa(capsys):
    """The prefill package's prompt form (flash's causal from the shapes) where AOTInductor fails on it: built again
    in the sdpa form, the model held until then (the last package keeps it while a fallback remains), dropped after,
    the reason said; the sdpa form failing in its turn stands."""
    from pathlib import Path
    from types import SimpleNamespace

    from softsyn.emit.torch_lowering import build_packages, planned
    from softsyn.library.torch_targets import TORCH_TARGETS

    calls, holder = [], ["model"]

    def build(design, held, built, folder, last):
        calls.append((built.file, built.attention, last))
        if built.attention in failing:
            raise RuntimeError(f"no kernel for {built.attention}")

    failing = {"prompt"}
    packages = planned(TORCH_TARGETS["h200-torch"], "matmul")
    build_packages(SimpleNamespace(torch_target="h200-torch", progress=True), packages, holder, Path("unused"), build)
    assert calls == [("model.pt2", "matmul", False), ("model-prefill.pt2", "prompt", False),
                     ("model-prefill.pt2", "sdpa", True)]
    assert packages[1].attention == "sdpa" and holder == []
    said = "model-prefill.pt2: AOTInductor failed on the prompt attention (RuntimeError: no kernel for prompt); built "
    assert packages[1].said[-1] == said + "in sdpa attention instead" and said in capsys.readouterr().err
    failing = {"prompt", "sdpa"}
    with pytest.raises(RuntimeError, match="no kernel for sdpa"):
        build_packages(SimpleNamespace(torch_target="h200-torch", progress=False),
                       planned(TORCH_TARGETS["h200-torch"], "matmul"), ["model"], Path("unused"), build)
