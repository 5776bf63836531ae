"""bench/fp16_gemv.py, the fp16 tensor-core GEMV prototype the chains time beside cuBLAS: its interpreter check (the
kernel against torch at shapes that fill no tile, rows 1-16) passes, so a lease measures a kernel that computes the
product."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_fp16_gemv_prototype_computes_the_product_in_triton_s_interpreter():
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "fp16_gemv.py")], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    error = float(done.stdout.split("worst relative error ")[1].split()[0])
    assert 0 < error < 2e-3
