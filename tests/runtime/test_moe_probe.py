"""bench/moe_probe.py's CPU-runnable core: ORT CPU's com.microsoft.MoE (softsyn's attributes) against the probe's
float64 reference on the tiny shape at 1 and 7 tokens. The reference agreeing with the CPU kernel is what makes a CUDA
departure from it, on the H200, the CUDA kernel's."""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from paths import ROOT

TOL = {"fp16": 2e-3, "fp32": 2e-6}  # measured 2026-12-03: fp16 3e-4, fp32 5e-7 (max|d| / max|ref|)
TOKENS = (1, 7)


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("moe_probe", ROOT / "bench" / "moe_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _cpu_errors(probe, case) -> list[float]:
    rows = probe.probe_shape(case.shape, case.dtype, [case], ("cpu",), TOKENS)
    assert [r.tokens for r in rows] == list(TOKENS) and all(r.cuda is None and r.cuda_cpu is None for r in rows)
    return [r.cpu for r in rows]


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("rank", [2, 3])
def test_cpu_moe_matches_the_reference(probe, dtype, rank):
    errors = _cpu_errors(probe, probe.Case("tiny", dtype, 1, rank))
    assert all(isinstance(e, float) and e < TOL[dtype] for e in errors), errors


def test_cpu_moe_matches_the_reference_unnormalised_fp32_and_with_large_values(probe):
    assert max(_cpu_errors(probe, probe.Case("tiny", "fp32", 0))) < TOL["fp32"]
    # gate/up values past 7: the CPU kernel clips nothing, with swiglu_limit inf or unset
    for limit in (True, False):
        assert max(_cpu_errors(probe, probe.Case("tiny", "fp16", 1, amp=probe.AMP, limit=limit))) < TOL["fp16"]


def test_cpu_fp16_unnormalised_moe_returns_zeros(probe):
    """ORT 1.31.1's CPU MoE in fp16 with normalize_routing_weights=0 outputs zeros (fp32 and normalised fp16 agree
    with the reference): the probe reports it as a departure, and the fuse pass's CPU probe would miss such a site."""
    case = probe.Case("tiny", "fp16", 0)
    assert min(_cpu_errors(probe, case)) == pytest.approx(1.0)
    fc1, fc2 = probe.weights("tiny", "fp16")
    x, logits = probe.feeds("tiny", "fp16", 7)
    assert not probe.run_tokens(probe.open_case(case, "cpu", fc1, fc2), case, x, logits).any()


def test_the_reference_tells_layout_and_normalisation_apart(probe):
    """The comparison can fail: gate/up read as halves instead of interleaved, or the other normalisation, puts the
    reference far from the CPU output."""
    case = probe.Case("tiny", "fp32", 1)
    _, k, _, inter = probe.SHAPES["tiny"]
    fc1, fc2 = probe.weights("tiny", "fp32")
    x, logits = probe.feeds("tiny", "fp32", 7)
    got = probe.run_tokens(probe.open_case(case, "cpu", fc1, fc2), case, x, logits)
    halves = np.concatenate([np.arange(inter) * 2, np.arange(inter) * 2 + 1])  # interleaved rows as gate | up halves
    assert probe.rel(got, probe.reference(x, logits, fc1[:, halves], fc2, k)[1]) > 0.1
    ref = probe.reference(x, logits, fc1, fc2, k)
    assert probe.rel(got, ref[1]) < TOL["fp32"] and probe.rel(got, ref[0]) > 0.1


def test_main_writes_the_cpu_table(probe, tmp_path, capsys):
    out = tmp_path / "probe.md"
    assert probe.main(["--provider", "cpu", "--shapes", "tiny", "--tokens", "1,7", "-o", str(out)]) == 0
    text = out.read_text()
    assert "onnxruntime 1.31.1" in text and "device: " in text
    rows = [line for line in text.splitlines() if line.startswith("| tiny ")]
    assert len(rows) == 2 * len(probe.cases(("tiny",)))
    assert all(line.split("|")[3].strip() == "-" and line.split("|")[5].strip() == "-" for line in rows)
    assert "| tiny fp32 norm1 3d | 7 | - | " in text
    assert probe.main(["--provider", "cpu", "--shapes", "tiny,70b"]) == 2
    assert "--shapes takes tiny, 30b, 80b" in capsys.readouterr().err
