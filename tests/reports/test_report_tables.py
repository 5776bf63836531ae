"""The fusion, signoff and verify reports: golden text on hand-built results (tests/reports/golden/*.rpt,
SOFTSYN_UPDATE_GOLDEN=1 rewrites them), and their tables as column data."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from softsyn.results.signoff import CellRow, GroupResult, OpRow, SignoffResult
from softsyn.results.verify import OutputCheck, VerifyResult
from reports import fusion_table, report_fusion, report_signoff, report_verify, verify_table
from reports.common import Column, fixed_line
from reports.signoff import cell_table, group_table, op_table, report_torch_signoff

GOLDEN = Path(__file__).parent / "golden"
MS = 1e-3
US = 1e-6


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SOFTSYN_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"golden file {path} missing; run with SOFTSYN_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from golden (SOFTSYN_UPDATE_GOLDEN=1 rewrites)"


# -------------------------------------------------------------------------------- fusion

@dataclass
class Miss:
    """What report_fusion reads of passes.fuse's Miss."""

    site: str
    reason: str


@dataclass
class Coverage:
    """What report_fusion reads of passes.fuse's Coverage (the fuse pass's result per kind)."""

    kind: str
    candidates: int = 0
    fused: int = 0
    misses: list[Miss] = field(default_factory=list)
    target_op: str = ""
    note: str = ""


def make_coverage() -> list[Coverage]:
    return [
        Coverage("rmsnorm", 7, 7, target_op="com.microsoft.SimplifiedLayerNormalization"),
        Coverage("skip_rmsnorm", 6, 5, [Miss("model.layers.2 (node_add_7)", "the residual Add feeds two consumers")],
                 target_op="com.microsoft.SkipSimplifiedLayerNormalization"),
        Coverage("rotary", 0, 0, target_op="com.microsoft.RotaryEmbedding",
                 note="no rotary embedding in this model"),
        Coverage("gqa_with_absorbed_rotary", 3, 1,  # longer than its column: pushes the row right
                 [Miss(f"model.layers.{i}.self_attn (node_softmax_{i})", f"softmax scale {i}.5 is not 1/sqrt(head_dim)")
                  for i in (1, 2)], target_op="com.microsoft.GroupQueryAttention"),
        Coverage("gelu", 1234567, 1234566, [Miss("mlp (node_tanh)", "Tanh approximation, not Erf")]),
    ]


FUSION_CASES = {
    "fusion.rpt": lambda cov: report_fusion(cov, design="toy-3layer", target="cuda"),
    "fusion_max_misses.rpt": lambda cov: report_fusion(cov, max_misses=2),
    "fusion_none_missed.rpt": lambda cov: report_fusion(cov[:1] + cov[2:3], design="toy-3layer"),
    "fusion_empty.rpt": lambda cov: report_fusion([], target="cpu"),
}


@pytest.mark.parametrize("name", sorted(FUSION_CASES))
def test_fusion_golden(name):
    check_golden(name, FUSION_CASES[name](make_coverage()))


# -------------------------------------------------------------------------------- signoff

def make_group(name: str, dims: dict, budget: float, predicted: float, measured: float, scale: float) -> GroupResult:
    cells = [
        CellRow("session.run", "session.run", "Run", 0.05 * MS, 0.21 * MS, "est", "residual", "session.run residual"),
        CellRow("model.layers.0.self_attn/GroupQueryAttention_fz966_with_a_name_longer_than_the_column",
                "GroupQueryAttention_fz966", "GroupQueryAttention", 0.008 * MS, 0.056 * MS, "est", "exact"),
        CellRow("lm_head/node_linear_196", "node_linear_196", "MatMul", 0.402 * MS, 0.241 * MS, "table",
                "fused-anchor", "MatMulNBits"),
        CellRow("model.layers.0.mlp/node_mul_3", "node_mul_3", "Mul", 0.004 * MS, 0.0, "annot", "absorbed"),
    ]
    by_op = [OpRow("GroupQueryAttention", 28, 0.213 * MS, 1.283 * MS), OpRow("MatMul", 113, 3.121 * MS, 2.395 * MS),
             OpRow("SkipSimplifiedLayerNormalization", 56, 0.394 * MS, 0.433 * MS), OpRow("Sigmoid", 28, 0.233 * MS, 0.0)]
    return GroupResult(
        name=name, description=f"{name} ({', '.join(f'{k} {v}' for k, v in dims.items())})", dims=dims,
        clock_period=budget + 0.2 * MS, input_delay=0.2 * MS, budget=budget, predicted=predicted,
        measured_median=measured, measured_quiet=measured * 0.97, measured_p10=measured * 0.98,
        measured_p90=measured * 1.04, runs=30, kernel_sum=measured * 0.9, residual=measured * 0.1,
        profiler_run=measured * 3.1, profiler_overhead=7.24 * US, kernel_scale=scale, predicted_overhead=0.051 * MS,
        counts={"profiled": 544, "exact": 516, "fused-anchor": 28, "absorbed": 29, "constant": 3, "runtime-only": 2},
        by_op=by_op, cells=cells, runtime_only={})


def make_signoff() -> SignoffResult:
    decode = make_group("decode", {"batch": 1, "seq": 1, "past": 512}, 2.0 * MS, 1.5 * MS, 2.1 * MS, 1.0)
    prefill = make_group("prefill", {"batch": 1, "seq": 512, "past": 0, "concurrency": 16}, math.inf,
                         6.464 * MS, 6.168 * MS, 0.518)
    return SignoffResult(
        design="toy-3layer", directory="out/toy", kind="compile", library="cpu-ort",
        library_source="onnxruntime 1.31.1 CPUExecutionProvider, measured 2026-11-30; delay tables",
        provider="CPUExecutionProvider", device="x86_64 (2 cores)", runtime="onnxruntime 1.31.1",
        date="2026-11-30T10:00:34+00:00", runs=30, warmup=3, node_time="kernel", model="out/toy/model.onnx",
        groups=[decode, prefill], annotation_file="out/toy/signoff/annotation.json",
        machine={"probe_before_s": 41.2 * US, "probe_after_s": 43.9 * US, "reference_s": 38.0 * US, "factor": 1.12},
        notes=["2 runtime-only kernels (MemcpyToHost) are in the residual"])


def signoff_gpu(result: SignoffResult) -> SignoffResult:
    result.provider, result.node_time, result.notes = "CUDAExecutionProvider", "host", []
    result.groups[0].measured_median = 1.9 * MS  # now MET: no "VIOLATED" section
    return result


def signoff_no_probe(result: SignoffResult) -> SignoffResult:
    result.machine = {"probe_before_s": 41.2 * US, "probe_after_s": 43.9 * US}
    result.library_source = ""
    result.groups[1].measured_median = 0.0  # a zero measurement: error n/a
    return result


def signoff_torch(result: SignoffResult) -> SignoffResult:
    """A torch package's signoff: no cells, its kernels by name and per source-module kind (Inductor's provenance),
    one kind fused across two modules (no single estimate), kernels no call accounts for."""
    result.provider, result.runtime, result.notes = "torch 2.11.0+cu130 (CUDA, float16, CUDA graphs)", "AOTInductor", []
    for g in result.groups:
        g.cells, g.by_op = [], []
        g.runtime_only = {"nvjet_sm90_hsh_128x8_64x12_4x1_v_bz_TNT": {"count": 28, "seconds": 0.431 * MS},
                          "triton_red_fused__softmax__to_copy_0": {"count": 28, "seconds": 0.738 * MS}}
        g.modules = {"self_attn": {"count": 112, "seconds": 1.102 * MS, "predicted": 0.640 * MS},
                     "mlp": {"count": 84, "seconds": 0.905 * MS, "predicted": 0.871 * MS},
                     "input_layernorm+mlp": {"count": 28, "seconds": 0.061 * MS, "predicted": None},
                     "(unattributed)": {"count": 1, "seconds": 0.004 * MS, "predicted": None}}
    return result


SIGNOFF_CASES = {
    "signoff_torch.rpt": lambda r: report_torch_signoff(signoff_torch(r)),
    "signoff.rpt": lambda r: report_signoff(r),
    "signoff_top2_us.rpt": lambda r: report_signoff(r, top=2, unit="us", digits=1),
    "signoff_gpu.rpt": lambda r: report_signoff(signoff_gpu(r)),
    "signoff_no_probe.rpt": lambda r: report_signoff(signoff_no_probe(r)),
}


@pytest.mark.parametrize("name", sorted(SIGNOFF_CASES))
def test_signoff_golden(name):
    check_golden(name, SIGNOFF_CASES[name](make_signoff()))


def test_signoff_without_machine():
    result = make_signoff()
    result.machine = {}
    assert "Machine" not in report_signoff(result)


# -------------------------------------------------------------------------------- verify

def make_verify() -> VerifyResult:
    checks = [
        OutputCheck("prefill", "logits", 3.1e-3, 2.4e-4, 0.99999871, 1.0, [], positions_over=0, positions=128),
        OutputCheck("prefill", "present_key_values.27.value_cache", 1.2e-2, 3.0e-2, 0.999123456, None,
                    ["rel error 3.000e-02 > 1.000e-02"]),
        OutputCheck("decode", "logits", 0.5, math.inf, -0.25, 0.8125,
                    ["rel error inf > 1.000e-02", "top-1 agreement 0.8125 < 0.9900"], positions_over=8, positions=8),
    ]
    return VerifyResult(checks, 1e-2, "default for fp16", 0.99, "CUDAExecutionProvider",
                        {"source": "zoo:qwen3-tiny", "precision": "fp32", "onnx": "ref.onnx"}, "fp16")


def verify_met(result: VerifyResult) -> VerifyResult:
    for c in result.checks:
        c.violations = []
    result.min_top1, result.reference, result.budget_source = None, {}, "accuracy.max_rel_error"
    return result


def verify_routed(result: VerifyResult) -> VerifyResult:
    """An MoE design whose prefill logits are off at 3 of 128 positions (near-tied experts), the rest within."""
    result.routed = 2
    result.checks[0] = OutputCheck("prefill", "logits", 1.151, 1.344e-1, 0.991846, 1.0,
                                   ["rel error 1.344e-01 > 1.000e-02 at 3 of 128 positions"], 3, 128)
    return result


VERIFY_CASES = {
    "verify.rpt": lambda r: report_verify(r, "out/tiny"),
    "verify_routed.rpt": lambda r: report_verify(verify_routed(r), "out/next80b"),
    "verify_met.rpt": lambda r: report_verify(verify_met(r), "out/tiny"),
}


@pytest.mark.parametrize("name", sorted(VERIFY_CASES))
def test_verify_golden(name):
    check_golden(name, VERIFY_CASES[name](make_verify()))


# -------------------------------------------------------------------------------- tables as data

def test_fixed_line_lays_out_like_format_specs():
    cols = (Column("a", "A", 6), Column("n", "N", 5, "right", "number", fmt="{:.1f}", gap=1),
            Column("t", "T", 7, "right", "time", gap=1), Column("s", "S", 4, gap=2, missing="-"))
    row = {"a": "abcdefgh", "n": 2.25, "t": 1.5e-3}
    assert fixed_line(cols, row) == f"{'abcdefgh':<6} {2.25:>5.1f} {'1.500':>7}  -"
    assert fixed_line(cols, row, unit="us", digits=0) == f"{'abcdefgh':<6} {2.25:>5.1f} {'1500':>7}  -"
    clipped = Column("a", "A", 8, clip=True)
    assert fixed_line((clipped, cols[1]), {"a": "model.layers.0", "n": 1.0}) == "...ers.0   1.0"


def test_tables_render_the_rows_their_json_holds():
    result, verify, coverage = make_signoff(), make_verify(), make_coverage()
    tables = {"fusion": (fusion_table(coverage), report_fusion(coverage)),
              "groups": (group_table(result), report_signoff(result)),
              "ops": (op_table(result.groups[0]), report_signoff(result)),
              "cells": (cell_table(result.groups[0]), report_signoff(result)),
              "verify": (verify_table(verify), report_verify(verify, "out/tiny"))}
    for name, (table, text) in tables.items():
        data = json.loads(json.dumps(table.to_dict()))
        keys = [c["key"] for c in data["columns"]]
        assert all(list(row) == keys for row in data["rows"]), name
        lines = text.splitlines()
        for line in [table.header(), *table.lines()]:
            assert any(l.strip() == line.strip() for l in lines), (name, line)
        assert len(data["rows"]) == len(table.lines()), name


def test_table_rows_hold_si_values():
    result = signoff_no_probe(make_signoff())
    decode, prefill = group_table(result).rows
    assert decode["measured"] == pytest.approx(2.1e-3) and decode["status"] == "VIOLATED (predicted MET)"
    assert prefill["budget"] == math.inf and prefill["error"] is None  # measured 0: printed n/a
    assert [r["error"] for r in op_table(result.groups[0]).rows][-1] is None
    assert cell_table(result.groups[0]).rows[1]["instance"].endswith("longer_than_the_column")  # clipped in text only
    rows = verify_table(make_verify()).rows
    assert rows[1]["top1"] is None and rows[2]["rel"] == math.inf and rows[0]["status"] == "MET"
    kinds = fusion_table(make_coverage()).rows
    assert kinds[2]["percent"] is None and kinds[1]["missed"] == 1
