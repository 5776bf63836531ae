"""The precision rule `moe_router`: a mixture-of-experts router never runs below fp16/bf16.

Top-k routing is a discrete choice: rounding the router logits (int8/int4 weights, fp8) flips which experts a
token runs whenever two scores lie closer than the error, so the layer's output changes by a whole expert, far
beyond the rounding itself. The rule names the router cells — the MatMul/Gemm that computes the logits fed to
com.microsoft.MoE/QMoE (through Casts), and for an unfused expert block the Softmax/Sigmoid and TopK too — so a
precision move keeps them at fp16/bf16 or wider. On the uniform fp16 map the unfused Softmax/TopK stay fp32
(an island) and the router MatMul is fp16, the floor; inside a fused MoE the op routes in its activation type.
"""
from __future__ import annotations

import onnx_ir as ir

from softsyn.netlist.keys import FP8_MATMUL

RULE = "moe_router"
FLOOR = ("fp32", "fp16", "bf16")  # the precisions router cells may take
MOE_OPS = {"MoE", "QMoE"}
SCORES = {"Softmax", "Sigmoid"}


def _logits_matmul(v: ir.Value | None) -> ir.Node | None:
    while v is not None and v.producer() is not None and v.producer().op_type == "Cast":
        v = v.producer().inputs[0]
    p = v.producer() if v is not None else None
    return p if p is not None and p.op_type in ("MatMul", "Gemm", "MatMulNBits", FP8_MATMUL) else None


def router_cells(graph: ir.Graph) -> dict[str, list[ir.Node]]:
    """{"matmul": router logit MatMuls, "scores": unfused Softmax/Sigmoid + TopK}: the cells the rule holds."""
    matmuls, scores = [], []
    for node in graph:
        if node.op_type in MOE_OPS and len(node.inputs) > 1:
            mm = _logits_matmul(node.inputs[1])
            if mm is not None:
                matmuls.append(mm)
        elif node.op_type == "TopK" and node.inputs:
            v = node.inputs[0]
            while v is not None and v.producer() is not None and v.producer().op_type == "Cast":
                v = v.producer().inputs[0]
            score = v.producer() if v is not None else None
            if score is not None and score.op_type in SCORES:
                scores += [score, node]
                mm = _logits_matmul(score.inputs[0])
                if mm is not None:
                    matmuls.append(mm)
    unique = lambda nodes: list({id(n): n for n in nodes}.values())  # noqa: E731
    return {"matmul": unique(matmuls), "scores": unique(scores)}


def summary(cells: dict[str, list[ir.Node]], realised: str) -> dict:
    """What the rule did at a uniform precision: the report and log entry."""
    n_mm, n_sc = len(cells["matmul"]), len(cells["scores"])
    return {"rule": RULE, "router_matmuls": n_mm, "router_scores": n_sc, "floor": "fp16/bf16",
            "held": f"{n_mm} router MatMul(s) at {realised} (never below fp16/bf16)"
                    + (f", {n_sc} Softmax/TopK cell(s) at fp32" if n_sc and realised != "fp32" else "")}
