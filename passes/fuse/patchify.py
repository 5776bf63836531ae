"""A patch embedding's Conv -> one GEMM: Reshape(x, [-1, C*k]) -> MatMul(W^T) (-> Add(bias)) -> Reshape back.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL embed patches that the processor has already cut out: pixel_values [patches,
C*T*P*P] viewed as [patches, C, T, P, P], then a Conv3d whose kernel (T, P, P) equals its stride and its input, so
every output is [patches, hidden, 1, 1, 1]: one dot product of a patch with each filter, a GEMM [patches, C*T*P*P] x
[C*T*P*P, hidden]. ORT's CUDA provider runs the Conv through cuDNN's 3-D convolution, which took 0.625 ms on the H200
for qwen3-vl-2b-reduced's 3136 patches (bench/results/vl-signoff-h200-2026-12-06.rpt) where the library's roofline
had 0.020 ms; as a MatMul it is a cell the library has measured tables for.

Candidates (anchors): every Conv. The form: group 1, dilations 1, no padding (pads all 0, auto_pad NOTSET or VALID),
strides equal to kernel_shape, the input's spatial dims static and equal to kernel_shape (so each output spatial dim
is 1), the weight a constant [O, C, *kernel] (readable or weightless), the bias (if any) a constant [O]. A Conv that
slides over a larger input (ViT's Conv2d over the whole image) is a miss with its reason: as a GEMM it needs two
Transposes around it, which this rule does not weigh.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from passes.fuse.base import Cell, Replacement, Rule, stand_in
from passes.fuse.graph import (add_initializer, add_weightless, attr, const, const_shape, fresh, insert_before, int64,
                               make_node, replace_value, weightless)


@dataclass
class _Patch:
    conv: ir.Node
    x: ir.Value  # the Conv's input [N, C, *k]
    weight: ir.Value  # [O, C, *k]
    bias: ir.Value | None  # [O]
    k: int  # C * prod(kernel): one patch's elements
    out_channels: int
    spatial: int  # the kernel's rank (3 for Conv3d)


class PatchEmbedRule(Rule):
    kind = "patch_embed"
    target_op = "MatMul (a patch embedding's Conv as one GEMM)"

    def anchors(self, ctx):
        return [n for n in ctx.graph if n.op_type == "Conv" and n.domain in ("", "ai.onnx")]

    def check(self, ctx, conv):
        x, w = conv.inputs[0], conv.inputs[1]
        b = conv.inputs[2] if len(conv.inputs) > 2 else None
        wshape = const_shape(w)
        if wshape is None or len(wshape) < 3:
            return f"weight {w.name} is not a constant [O, C, *kernel]"
        kernel = list(attr(conv, "kernel_shape", None) or wshape[2:])
        if attr(conv, "group", 1) != 1:
            return f"group {attr(conv, 'group', 1)}: a grouped convolution is not one GEMM"
        if any(d != 1 for d in attr(conv, "dilations", None) or [1] * len(kernel)):
            return f"dilations {attr(conv, 'dilations')}: not a patch embedding"
        if any(p != 0 for p in attr(conv, "pads", None) or [0]) or attr(conv, "auto_pad", "NOTSET") not in (
                "NOTSET", "VALID", b"NOTSET", b"VALID"):
            return f"padded ({attr(conv, 'pads')}, auto_pad {attr(conv, 'auto_pad')}): not a patch embedding"
        if list(attr(conv, "strides", None) or [1] * len(kernel)) != kernel:
            return f"strides {attr(conv, 'strides')} differ from kernel_shape {kernel}: overlapping patches"
        spatial = list(x.shape)[2:] if x.shape is not None else None
        if spatial is None or spatial != kernel:
            return (f"input {x.name} spatial dims {spatial} are not the kernel {kernel}: the Conv slides over a larger "
                    "input (as a GEMM it needs Transposes around it)")
        if b is not None and (const_shape(b) is None or len(const_shape(b)) != 1):
            return f"bias {b.name} is not a constant [O]"
        if x.dtype is not None and w.dtype is not None and x.dtype != w.dtype:
            return f"input {x.dtype} and weight {w.dtype} differ"
        return _Patch(conv, x, w, b, k=int(np.prod(wshape[1:])), out_channels=int(wshape[0]), spatial=len(kernel))

    def _shapes(self, m: _Patch):
        n = list(m.x.shape)[0] if m.x.shape is not None else None
        return [n, m.k], [m.k, m.out_channels], [n, m.out_channels]

    def rewrite(self, ctx, m: _Patch):
        g, conv = ctx.graph, m.conv
        out = conv.outputs[0]
        flat_shape, w_shape, mm_shape = self._shapes(m)
        name = (m.weight.name or "patch_embed") + ".gemm"
        array = const(m.weight)
        if array is None and weightless(m.weight):
            wt = add_weightless(g, name, w_shape, m.weight.dtype)
        else:
            wt = add_initializer(g, name, np.ascontiguousarray(array.reshape(m.out_channels, m.k).T))
        flat = make_node(conv, "", "Reshape", [m.x, int64(g, fresh("patch_flat"), [-1, m.k])])
        flat.outputs[0].type, flat.outputs[0].shape = m.x.type, ir.Shape(flat_shape)
        mm = make_node(conv, "", "MatMul", [flat.outputs[0], wt])
        mm.outputs[0].type, mm.outputs[0].shape = out.type, ir.Shape(mm_shape)
        new, src = [flat, mm], mm.outputs[0]
        if m.bias is not None:
            add = make_node(conv, "", "Add", [src, m.bias])
            add.outputs[0].type, add.outputs[0].shape = out.type, ir.Shape(mm_shape)
            new.append(add)
            src = add.outputs[0]
        back = make_node(conv, "", "Reshape", [src, int64(g, fresh("patch_back"), [-1, m.out_channels]
                                                          + [1] * m.spatial)])
        back.outputs[0].type, back.outputs[0].shape = out.type, out.shape
        new.append(back)
        insert_before(g, conv, new)
        replace_value(g, out, back.outputs[0])

    def replacement(self, ctx, m: _Patch) -> Replacement:
        flat_shape, w_shape, mm_shape = self._shapes(m)
        dtype = m.x.dtype
        flat, wt = stand_in("patch_flat", flat_shape, dtype), stand_in("patch_w", w_shape, dtype)
        mm = stand_in("patch_mm", mm_shape, dtype)
        cells = [Cell("Reshape", (m.x,), (flat,), domain=""), Cell("MatMul", (flat, wt), (mm,), domain="")]
        if m.bias is not None:
            biased = stand_in("patch_bias", mm_shape, dtype)
            cells.append(Cell("Add", (mm, m.bias), (biased,), domain=""))
            mm = biased
        cells.append(Cell("Reshape", (mm,), (m.conv.outputs[0],), domain=""))
        reads = (m.x, m.weight) + ((m.bias,) if m.bias is not None else ())
        return Replacement(tuple(cells), (m.conv.outputs[0],), reads)
