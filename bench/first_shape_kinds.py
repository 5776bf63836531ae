"""What a first run at a new row count costs on ONNX Runtime, per kind of chain: one MatMul, eight of one shape, eight
of distinct shapes, eight Adds; fp16 on CUDA (fp32 on the CPU). Settles whether the cost is per node or per distinct
GEMM shape (a per-shape algorithm cache). Prints one line per chain: median extra of the first run, ms."""
import statistics
import sys
import time

import numpy as np
from onnx import TensorProto, helper

from softsyn.runtime.session import IR_VERSION, SessionSettings, open_session

provider = sys.argv[1] if len(sys.argv) > 1 else "cpu"
dt, npt = (TensorProto.FLOAT16, np.float16) if provider == "cuda" else (TensorProto.FLOAT, np.float32)
W = 512


def chain(widths, op="MatMul"):
    rng = np.random.default_rng(0)
    inits, nodes, k = [], [], W
    for i, n in enumerate(widths):
        shape = [k, n] if op == "MatMul" else [k]
        inits.append(helper.make_tensor(f"w{i}", dt, shape, (rng.standard_normal(shape) * 0.04).astype(npt).tobytes(), raw=True))
        nodes.append(helper.make_node(op, [f"x{i}", f"w{i}"], [f"x{i + 1}"]))
        k = n if op == "MatMul" else k
    g = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x0", dt, ["rows", W])],
                          [helper.make_tensor_value_info(f"x{len(widths)}", dt, ["rows", k])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION)
    s = open_session(m, SessionSettings(provider=provider, log_severity=3))
    return lambda r: s.run(None, {"x0": np.ones((r, W), npt)})


def extra(run, rows):
    for _ in range(3):
        run(rows[-1] + 1)
    out = []
    for r in rows:
        ts = []
        for _ in range(4):
            t = time.perf_counter()
            run(r)
            ts.append(time.perf_counter() - t)
        out.append(ts[0] - min(ts[1:]))
    return statistics.median(out) * 1e3


rows = list(range(33, 33 + 7 * 24, 7))
for name, widths, op in (("1 MatMul", [W], "MatMul"), ("8 MatMul same shape", [W] * 8, "MatMul"),
                         ("8 MatMul distinct shapes", [W + 64 * i for i in range(1, 9)], "MatMul"),
                         ("32 MatMul same shape", [W] * 32, "MatMul"), ("8 Add", [W] * 8, "Add"),
                         ("64 Add", [W] * 64, "Add")):
    print(f"{name}: first run +{extra(chain(widths, op), rows):.4f} ms (median over {len(rows)} fresh row counts)")
