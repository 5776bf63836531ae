"""Helpers several test folders share: softsyn's command line run in this process, a tiny MLP as an ONNX file, and
the fusion report read back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from softsyn.cli import run


def cli(capsys, *args) -> tuple[int, str, str]:
    """`softsyn ARGS` in this process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        run([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def mlp(path: Path, names=("", "", "dup", "dup", ""), extra_nodes=(), external=False) -> Path:
    """x[2,16] -> MatMul(W1) -> Relu -> MatMul(W2) -> Add(b) -> Sigmoid -> y, nodes named by `names`
    (onnx.helper leaves a node unnamed by default)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W2"),
             numpy_helper.from_array(rng.standard_normal((16,)).astype(np.float32), "b")]
    specs = [("MatMul", ["x", "W1"], ["h1"]), ("Relu", ["h1"], ["h2"]), ("MatMul", ["h2", "W2"], ["h3"]),
             ("Add", ["h3", "b"], ["h4"]), ("Sigmoid", ["h4"], ["y"])]
    nodes = [helper.make_node(op, i, o, **({"name": n} if n else {})) for (op, i, o), n in zip(specs, names)]
    graph = helper.make_graph(nodes + list(extra_nodes), "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    if external:
        onnx.save(model, path, save_as_external_data=True, location=path.name + ".data", size_threshold=0)
    else:
        onnx.save(model, path)
    return path


def fusion_report(path):
    """({kind: (candidates, fused)}, [(kind, site, reason)]) read back from DIR/reports/fusion.rpt."""
    lines = path.read_text().splitlines()
    kinds, misses = {}, []
    for i, line in enumerate(lines):
        parts = line.split()
        if len(parts) >= 5 and parts[1].isdigit() and parts[2].isdigit() and parts[0] != "Total":
            kinds[parts[0]] = (int(parts[1]), int(parts[2]))
        if line.startswith("  [") and lines[i + 1].strip().startswith("reason: "):
            kind, site = line.strip()[1:].split("] ", 1)
            misses.append((kind, site, lines[i + 1].strip()[len("reason: "):]))
    return kinds, misses


def in_triton_interpreter(script: str) -> dict:
    """Run `script` in a fresh Python under Triton's interpreter (TRITON_INTERPRET=1: Triton kernels on CPU tensors)
    and return the JSON dict it prints last; skipped where Triton is not installed."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
