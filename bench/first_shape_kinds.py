"""What a first run at a new row count costs on ONNX Runtime, per kind of chain: one MatMul, eight of one shape, eight
of distinct shapes, eight Adds; fp16 on CUDA (fp32 on the CPU). Settles whether the cost is per node or per distinct
GEMM shape (a per-shape algorithm cache). Prints one line per chain: median extra of the first run, ms. The chains and
the timing are softsyn.characterize.host's (the serving_host probe's first_shape figures).

    python bench/first_shape_kinds.py [cpu|cuda]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softsyn.characterize.host import FIRST_ROWS, FIRST_WIDTH as W, chain_session, first_run_extra  # noqa: E402

provider = sys.argv[1] if len(sys.argv) > 1 else "cpu"
for name, widths, op in (("1 MatMul", [W], "MatMul"), ("8 MatMul same shape", [W] * 8, "MatMul"),
                         ("8 MatMul distinct shapes", [W + 64 * i for i in range(1, 9)], "MatMul"),
                         ("32 MatMul same shape", [W] * 32, "MatMul"), ("8 Add", [W] * 8, "Add"),
                         ("64 Add", [W] * 64, "Add")):
    extra = first_run_extra(chain_session(provider, op, widths)) * 1e3
    print(f"{name}: first run +{extra:.4f} ms (median over {len(FIRST_ROWS)} fresh row counts)")
