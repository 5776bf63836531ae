"""A torch target with a prefill attention form (h200-torch's matmul + prompt, here on the CPU as a test target): two
AOTInductor packages, model.pt2 for decode and model-prefill.pt2 for seq > 1, both named in runtime/torch.json with
their kernel maps, the runner picking by the step's seq; one set of weights (in model.pt2, read by both programs),
with the fallbacks where torch refuses said; an escaping package path refused."""
import dataclasses
import json
import re
import shutil
import zipfile

import numpy as np
import pytest

from conftest import built_once, compile_in_process
from helpers import cli
from paths import ROOT

TARGET = "cpu-torch-prefill"  # a test instance of cpu-torch, registered for this module's compile only


@pytest.fixture(scope="module")
def two_package_artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:qwen3-tiny -c constraints/cpu-torch-tiny.yaml --target cpu-torch-prefill -o DIR`, the
    target cpu-torch with attention "matmul" and prefill_attention "prompt" (h200-torch's): DIR, compiled once."""
    from softsyn.library.torch_targets import TORCH_TARGETS

    two = dataclasses.replace(TORCH_TARGETS["cpu-torch"], name=TARGET, attention="matmul", prefill_attention="prompt")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TORCH_TARGETS, TARGET, two)
        return built_once(tmp_path_factory, "tiny-torch-prefill", lambda out: compile_in_process(
            out, "zoo:qwen3-tiny", "-c", ROOT / "constraints" / "cpu-torch-tiny.yaml", "--target", TARGET,
            "--cache-dir", cache_dir))


def test_both_packages_written_and_named(two_package_artifact):
    from softsyn.runtime.torch_package import read_torch_settings
    from softsyn.runtime.torch_provenance import read_calls

    out = two_package_artifact
    settings = read_torch_settings(out)
    assert settings["package"] == "model.pt2"
    assert settings["packages"] == {
        "decode": {"file": "model.pt2", "attention": "matmul", "min_seq": 1, "kernels": "runtime/torch_kernels.json",
                   "constants": "own", "span": "rounded"},
        "prefill": {"file": "model-prefill.pt2", "attention": "prompt", "min_seq": 2,
                    "kernels": "runtime/torch_kernels-prefill.json", "constants": "decode", "span": "end"}}
    assert (out / "model.pt2").stat().st_size > 0 and (out / "model-prefill.pt2").stat().st_size > 0
    decode, prefill = read_calls(out), read_calls(out, "runtime/torch_kernels-prefill.json")
    assert decode and prefill and decode != prefill  # each package's own kernels
    assert any(c.kind == "lm_head" for c in prefill)
    log = (out / "compile.log").read_text()
    assert re.search(rf"^note: target {TARGET}: 2 packages built \(model.pt2 [\d.]+ s, model-prefill.pt2 [\d.]+ s,",
                     log, re.M)
    assert f"note: target {TARGET}: model-prefill.pt2 is the step lowered by torch.export + AOTInductor for steps " \
           "of seq >= 2" in log
    said = re.search(rf"^note: target {TARGET}: weights held once: model-prefill.pt2 reads model.pt2's .*; on disk "
                     r"model.pt2 ([\d.]+) MB, model-prefill.pt2 ([\d.]+) MB \(the weights once, in model.pt2; .*in "
                     r"memory once \(the area report counts one, as held\)$", log, re.M)
    assert said and [float(x) for x in said.groups()] == [round(p.stat().st_size / 1e6, 1) for p in
                                                          (out / "model.pt2", out / "model-prefill.pt2")]
    measured = re.findall(rf"^note: target {TARGET}: (prefill|decode) \(.*; (model[-\w]*\.pt2)\): [\d.]+ ms \(torch "
                          r"package, measured", log, re.M)
    assert sorted(measured) == [("decode", "model.pt2"), ("prefill", "model-prefill.pt2")]
    manifest = json.dumps(json.loads((out / "softsyn-manifest.json").read_text()))
    assert "model-prefill.pt2" in manifest and "torch_kernels-prefill.json" in manifest


class Counted:
    """A package runner that counts its calls."""

    def __init__(self, runner):
        self.runner, self.calls, self.spans = runner, 0, []

    def __call__(self, *args):
        self.calls += 1
        self.spans.append(args[2].shape[0])  # slots
        return self.runner(*args)


def test_prefill_runs_on_its_package_decode_on_the_other(two_package_artifact, tiny_torch_artifact):
    """generate: the prompt's step on model-prefill.pt2 over exactly its positions (span "end": the prompt form's
    causal mask comes from the shapes), each decode step on model.pt2 over the span rounded up, the greedy tokens
    those of the single-package (sdpa) artifact; each package's logits, a continued prompt's too (past > 0, where
    the mask is the bottom-right causal one), within fp32 rounding of the eager sdpa or matmul step's over the
    rounded span."""
    import torch

    from softsyn.emit.torch_attention_forms import ATTENTIONS
    from softsyn.emit.torch_step import StaticStep, pack_projections
    from softsyn.frontends import source_torch_model
    from softsyn.runtime.torch_package import TorchStep, read_torch_settings

    step = TorchStep(two_package_artifact, read_torch_settings(two_package_artifact))
    step.runners = {name: Counted(runner) for name, runner in step.runners.items()}
    prompt = np.arange(1, 20)
    tokens = step.generate(prompt, 6).tokens
    assert (step.runners["prefill"].calls, step.runners["decode"].calls) == (1, 5)
    assert step.runners["prefill"].spans == [19] and set(step.runners["decode"].spans) == {256}
    single = TorchStep(tiny_torch_artifact, read_torch_settings(tiny_torch_artifact))
    assert tokens == single.generate(prompt, 6).tokens

    model = source_torch_model("zoo:qwen3-tiny").eval()
    pack_projections(model)
    cache, eager_cache = step.empty_cache(), step.empty_cache()
    more = np.array([tokens[:5]])  # a second chunk of prompt after the first: the prefill package at past 19
    got = [step(prompt[None], 0, cache), step(more, len(prompt), cache), step(np.array([[tokens[5]]]), 24, cache)]
    with torch.no_grad():
        want = []
        for form, ids, start in (("sdpa", prompt[None], 0), ("sdpa", more, len(prompt)),
                                 ("matmul", np.array([[tokens[5]]]), 24)):
            model.set_attn_implementation(ATTENTIONS[form][0])
            positions = torch.arange(start, start + ids.shape[1])[None]
            want.append(StaticStep(model, step.max_length, last_logits=True)(torch.from_numpy(ids), positions,
                                                                             torch.arange(256), *eager_cache))
    assert [g.shape[1] for g in got] == [1, 1, 1]  # the netlist's last-position logits, at the prompt too
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def blobs(package):
    """The weight blobs in a package's archive (AOTInductor's binary_blob form)."""
    with zipfile.ZipFile(package) as archive:
        return [n for n in archive.namelist() if n.endswith(".blob")]


def test_one_set_of_weights_read_by_both_programs(two_package_artifact):
    """model.pt2 holds the weights (one blob beside its program), model-prefill.pt2 none; loaded, both programs read
    the same tensors (user-managed: every constant either names is one of them, on the same storage), and
    model.pt2 alone still loads and runs as the README's loader does, to the shared runner's logits."""
    import torch

    from softsyn.runtime.torch_package import TorchStep, read_torch_settings

    out = two_package_artifact
    assert len(blobs(out / "model.pt2")) == 1 and blobs(out / "model-prefill.pt2") == []
    step = TorchStep(out, read_torch_settings(out))
    assert step.shared is not None and step.weights.startswith("weights held once")
    for runner in step.runners.values():
        assert set(runner.get_constant_fqns()) <= set(step.shared.tensors)
    blob = zipfile.ZipFile(out / "model.pt2").getinfo(blobs(out / "model.pt2")[0]).file_size
    assert blob >= step.shared.nbytes > blob // 2  # the blob's tensors, once (the blob pads each to 64 bytes)
    ids = np.arange(1, 8)[None]
    got = step(ids, 0, step.empty_cache())
    alone = torch._inductor.aoti_load_package(str(out / "model.pt2"))
    want = alone(*_inputs(ids), torch.arange(256), *step.empty_cache())
    torch.testing.assert_close(got, want[0] if isinstance(want, (list, tuple)) else want, rtol=1e-4, atol=1e-4)


def _inputs(ids):
    import torch

    from softsyn.runtime.torch_package import input_views, step_inputs

    return input_views(torch.from_numpy(step_inputs(ids, 0)), ids.shape)


@pytest.mark.parametrize("refused, said, packages", [
    ("sharing", "weights held twice: model-prefill.pt2 could not share model.pt2's (refused here); it got a copy",
     ["decode", "prefill"]),
    ("reading", "weights held once, by model.pt2, which serves every step: model-prefill.pt2 holds none and this "
                "torch cannot give it model.pt2's (refused here; refused here)", ["decode"]),
])
def test_where_torch_refuses_sharing_the_fallback_is_said(two_package_artifact, monkeypatch, refused, said,
                                                          packages):
    """A torch that cannot point model-prefill.pt2 at model.pt2's weights gives it a copy; one that cannot read them
    at all runs every step on model.pt2: either way the step's `weights` says so, and the greedy tokens are those of
    the shared runner."""
    from softsyn.runtime import torch_package, torch_weights
    from softsyn.runtime.torch_package import TorchStep, read_torch_settings

    def refuse(*args, **kwargs):
        raise torch_weights.SharingUnavailable("refused here")

    settings = read_torch_settings(two_package_artifact)
    prompt = np.arange(1, 20)
    shared = TorchStep(two_package_artifact, settings).generate(prompt, 4).tokens
    monkeypatch.setattr(torch_package, "load_shared", refuse)
    if refused == "reading":
        monkeypatch.setattr(torch_weights, "read_weights", refuse)
    step = TorchStep(two_package_artifact, settings)
    assert step.shared is None and step.weights == said and sorted(step.runners) == packages
    assert step.package_for(19) == packages[-1]
    assert step.generate(prompt, 4).tokens == shared


def test_verify_checks_both_packages(two_package_artifact, cache_dir):
    """verify's prefill scenario runs on model-prefill.pt2 and its decode on model.pt2: both MET."""
    from click.testing import CliRunner

    from softsyn.cli import main

    result = CliRunner().invoke(main, ["verify", str(two_package_artifact), "--cache-dir", str(cache_dir), "--json",
                                       "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    data = json.loads(result.output)
    assert data["violations"] == [] and "model.pt2; model-prefill.pt2 at seq >= 2" in data["provider"]
    assert all(c["rel"] < 1e-4 for c in data["checks"])


@pytest.mark.parametrize("key, value, said", [
    ("file", "../model-prefill.pt2", 'packages.prefill.file: "../model-prefill.pt2" leads out of'),
    ("kernels", "/etc/passwd", 'packages.prefill.kernels: "/etc/passwd" leads out of'),
    ("min_seq", 1, "packages.prefill.min_seq: 1 is not valid; valid: an integer 2.."),
    ("constants", "../model.pt2", 'packages.prefill.constants: "../model.pt2" is not valid; valid: "own" or "decode"'),
    ("span", "all", 'packages.prefill.span: "all" is not valid; valid: "rounded" or "end"'),
    ("decode.constants", "decode", 'packages.decode.constants: "decode" is not valid; valid: "own";'),
])
def test_a_bad_prefill_package_entry_is_refused(two_package_artifact, tmp_path, capsys, key, value, said):
    copy = tmp_path / "copy"
    shutil.copytree(two_package_artifact, copy)
    path = copy / "runtime" / "torch.json"
    settings = json.loads(path.read_text())
    name, _, key = key.rpartition(".")
    settings["packages"][name or "prefill"][key] = value
    path.write_text(json.dumps(settings))
    code, out, err = cli(capsys, "run", copy, "-q")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and f"runtime/torch.json: {said}" in err


def test_signoff_refuses_a_bad_prefill_kernel_map(two_package_artifact, tmp_path, capsys):
    """The prefill package's map is read (and checked) before any step runs, as the decode one's is."""
    copy = tmp_path / "art"
    shutil.copytree(two_package_artifact, copy)
    kernels = copy / "runtime" / "torch_kernels-prefill.json"
    data = json.loads(kernels.read_text())
    data["calls"][0] = {"kernel": 7, "modules": []}
    kernels.write_text(json.dumps(data))
    code, out, err = cli(capsys, "signoff", copy, "-q")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "runtime/torch_kernels-prefill.json: calls[0]: not {kernel: a name, modules: [paths]}" in err
    assert not (copy / "signoff").exists()


def test_signoff_attributes_each_group_with_its_package_s_map(two_package_artifact, tmp_path, monkeypatch):
    """signoff's per-module kernel time reads the map of the package a group ran: a group's profile (here the
    kernels of its package's map in call order, as one step on CUDA launches them; the CPU profiler sees none) is
    attributed whole with that map; the prefill profile read with the decode map would leave kernels unattributed."""
    from reports import from_json
    from softsyn.flow import torch_signoff
    from softsyn.runtime.torch_profile import Profile
    from softsyn.runtime.torch_provenance import UNATTRIBUTED, read_calls

    maps = {"prefill": read_calls(two_package_artifact, "runtime/torch_kernels-prefill.json"),
            "decode": read_calls(two_package_artifact)}
    profiled = {k: [(c.kernel, 1e-6) for c in calls] * torch_signoff.PROFILED_STEPS for k, calls in maps.items()}
    monkeypatch.setattr(torch_signoff, "profile_step", lambda step, dims, steps: Profile(
        tuple(profiled[step.package_for(dims.get("seq", 1))]), steps, named=False))
    copy = tmp_path / "art"
    shutil.copytree(two_package_artifact, copy)
    result = torch_signoff.signoff(copy, runs=5, warmup=1, progress=False)
    modules = {g.name: g.modules for g in result.groups}
    assert set(modules) == {"prefill", "decode"}
    for name, rows in modules.items():
        assert rows and UNATTRIBUTED not in rows and "lm_head" in rows, (name, rows)
    group = next(g for g in from_json((copy / "analysis.json").read_text()).groups if g.name == "prefill")
    crossed = torch_signoff.kernels_by_module(group, profiled["prefill"], maps["decode"])
    assert UNATTRIBUTED in crossed  # the maps differ where the forms do: which one is read matters
