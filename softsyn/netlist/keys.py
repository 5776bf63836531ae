"""Names every floor reads on a netlist: node metadata keys, the weightless marker, op names the passes write.

They live here, on the netlist's floor, so a frontend, the timer, the runtime and a pass name the same string
without importing each other.
"""
from __future__ import annotations

import re

import onnx_ir as ir

REQUESTED_KEY = "softsyn.precision_request"  # node metadata: the precision the mapping asked this cell for
META_WEIGHTS = "weights.not-materialised"  # external-data location of meta (weightless) initializers
FP8_MATMUL = "MatMulBlockQuantizedFp8Weight"  # com.microsoft's block-scaled fp8 (e4m3) weight-only MatMul
# A hybrid decoder's fixed-size state ports (Qwen3-Next's linear-attention layers), named as onnxruntime-genai names
# them: past.N.conv / past.N.recurrent in, present.N.conv / present.N.recurrent out (N: the model's layer index)
STATE_PORT = re.compile(r"(past|present)\.(\d+)\.(conv|recurrent)")


def is_weightless(value: ir.Value) -> bool:
    """Whether the value's tensor is a weightless (meta) initializer: timed and sized, never run."""
    t = value.const_value
    return isinstance(t, ir.ExternalTensor) and str(t.location) == META_WEIGHTS
