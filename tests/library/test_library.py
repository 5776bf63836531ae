"""Library loading, validation, roofline and delay-table rules, and the ceilings measurement.

Table rules under test (see softsyn.library.interp's docstring): inside the grid a cell gives source
"table" with log-log multilinear interpolation; outside it gives "table-extrap" (edge value held
below the grid, edge slope continued, floored at 0, above it); a cell whose axes are not all in
`sizes` does not match and the roofline ("est") is used.
"""
from __future__ import annotations

import math
import re
import time

import pytest
import yaml

from softsyn.errors import SoftsynError
from softsyn.library import Ceilings, Library, default_library, load_library, parse_library, shipped_libraries

HEADER = {
    "library": "toy", "format": 1, "runtime": "onnxruntime 1.31.1", "provider": "CPUExecutionProvider",
    "device": "toy cpu, 1 core", "date": "2026-11-30", "command": "hand-written for a test",
}
CEILINGS = {"memory_bandwidth": 1.0e10, "peak_flops": {"fp32": 1.0e11, "int4": 2.0e11},
            "launch_overhead": 1.0e-6, "launch_overhead_graph": None, "run_overhead": 2.0e-5}


def write_lib(tmp_path, cells=(), **overrides):
    data = dict(HEADER, ceilings=dict(CEILINGS), cells=list(cells))
    for k, v in overrides.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_shipped_libraries_load_and_validate():
    names = shipped_libraries()
    assert {"cpu-ort", "h200-ort-cuda"} <= set(names)
    assert default_library() == "cpu-ort"
    for name in names:
        lib = load_library(name)
        assert isinstance(lib, Library) and isinstance(lib.ceilings, Ceilings)
        assert lib.name == name
        c = lib.ceilings
        assert c.memory_bandwidth > 0 and c.launch_overhead > 0 and c.run_overhead > 0
        assert c.peak_flops and all(v > 0 for v in c.peak_flops.values())
        assert lib.path.is_file()
        assert lib.describe().startswith(f"{name} (onnxruntime 1.31.1 ")
        assert re.search(r", measured 20\d\d-\d\d-\d\d\)$", lib.describe()), lib.describe()


def test_cpu_and_gpu_libraries():
    cpu, gpu = load_library("cpu-ort"), load_library("h200-ort-cuda")
    assert not cpu.is_gpu and gpu.is_gpu
    assert cpu.header["command"].startswith(("python -m softsyn.characterize.ceilings", "softsyn characterize"))
    assert gpu.header["command"].startswith("softsyn characterize --runtime ort --provider cuda")
    assert "H200" in gpu.header["device"] and gpu.provider == "CUDAExecutionProvider"
    # measured under ORT CUDA: HBM copy in the TB/s range, fp16 GEMM in the hundreds of TFLOP/s, launch in µs
    assert 2e12 < gpu.ceilings.memory_bandwidth < 5e12
    assert 3e14 < gpu.ceilings.peak_flops["fp16"] < 1e15
    assert 1e-6 < gpu.ceilings.launch_overhead < 2e-5
    assert gpu.ceilings.launch_overhead_graph < gpu.ceilings.launch_overhead
    assert "fp8" not in gpu.ceilings.peak_flops  # not attempted: documented in notes, never guessed
    assert gpu.peak_flops_for("fp8") == gpu.ceilings.peak_flops["fp16"]
    # Documented fallbacks: weight-only formats compute in the activation type (fp16 on GPU, fp32 on CPU).
    assert cpu.peak_flops_for("bf16") == cpu.ceilings.peak_flops["fp32"]  # no bf16 MatMul on ORT CPU
    assert cpu.peak_flops_for("fp16") == cpu.ceilings.peak_flops["fp32"]  # Cast to fp32 on ORT CPU
    assert cpu.peak_flops_for("float32") == cpu.ceilings.peak_flops["fp32"]
    with pytest.raises(SoftsynError, match="unknown precision 'fp7'"):
        cpu.peak_flops_for("fp7")


def test_roofline_hand_example(tmp_path):
    lib = load_library(str(write_lib(tmp_path)))
    # 1 GFLOP, 1 MB: compute 1e9 / 1e11 = 10 ms > memory 1e6 / 1e10 = 0.1 ms; + 1 us launch.
    d, src = lib.delay("MatMul", "fp32", 1e9, 1e6)
    assert src == "est" and d == pytest.approx(10e-3 + 1e-6)
    # Memory-bound: 1 MFLOP, 100 MB -> 10 ms of memory.
    d, src = lib.delay("Add", "fp32", 1e6, 1e8, {"n": 5})
    assert src == "est" and d == pytest.approx(1e8 / 1e10 + 1e-6)
    # int4 has its own figure; fp16 falls back to fp32 on a CPU library.
    assert lib.delay("MatMulNBits", "int4", 2e9, 0)[0] == pytest.approx(2e9 / 2e11 + 1e-6)
    assert lib.delay("MatMul", "fp16", 1e9, 0)[0] == pytest.approx(1e9 / 1e11 + 1e-6)
    assert lib.delay("Identity", "fp32", 0, 0) == (pytest.approx(1e-6), "est")


CELL = {"op": "MatMul", "precision": "fp32", "implementation": "ort-cpu", "axes": ["m", "k"],
        "points": [[1, 4, 16], [64, 256]],
        # delays[i][j] at m = points[0][i], k = points[1][j]
        "delays": [[1e-5, 4e-5], [2e-5, 8e-5], [8e-5, 3.2e-4]],
        "bytes_per_weight": 4, "error": None}


def test_table_interpolation_and_extrapolation(tmp_path):
    lib = load_library(str(write_lib(tmp_path, cells=[CELL])))
    assert len(lib.cells) == 1 and lib.cells[0].name == "MatMul.fp32.ort-cpu"
    # On a grid point: the measured value.
    assert lib.delay("MatMul", "fp32", 1, 1, {"m": 4, "k": 256}) == (pytest.approx(8e-5), "table")
    # Between grid points: log-log interpolation. m = 2 is halfway between 1 and 4 in log space:
    # sqrt(1e-5 * 2e-5) at k = 64.
    d, src = lib.delay("MatMul", "fp32", 1, 1, {"m": 2, "k": 64, "n": 99})
    assert src == "table" and d == pytest.approx(math.sqrt(1e-5 * 2e-5))
    assert 1e-5 < d < 2e-5
    # Both axes between points: k = 128 halfway between 64 and 256 -> geometric mean of the 4 corners.
    d, _ = lib.delay("MatMul", "fp32", 1, 1, {"m": 2, "k": 128})
    assert d == pytest.approx((1e-5 * 4e-5 * 2e-5 * 8e-5) ** 0.25)
    # Above the grid: the edge segment's power law continues (m 4 -> 16 is x4 in delay, so m = 64 -> x16).
    d, src = lib.delay("MatMul", "fp32", 1, 1, {"m": 64, "k": 64})
    assert src == "table-extrap" and d == pytest.approx(8e-5 * 4)
    # Below the grid: the edge value is held.
    d, src = lib.delay("MatMul", "fp32", 1, 1, {"m": 1, "k": 8})
    assert src == "table-extrap" and d == pytest.approx(1e-5)
    # No match: other precision, or an axis missing from sizes, or no sizes -> roofline.
    assert lib.delay("MatMul", "int4", 1e9, 0, {"m": 4, "k": 64})[1] == "est"
    assert lib.delay("MatMul", "fp32", 1e9, 0, {"m": 4})[1] == "est"
    assert lib.delay("MatMul", "fp32", 1e9, 0)[1] == "est"
    # The implementation can be named.
    assert lib.delay("MatMul", "fp32", 1, 1, {"m": 4, "k": 64}, implementation="ort-cpu")[1] == "table"
    assert lib.delay("MatMul", "fp32", 1e9, 0, {"m": 4, "k": 64}, implementation="other")[1] == "est"


def test_table_extrapolation_never_decreases(tmp_path):
    cell = dict(CELL, axes=["m"], points=[[1, 2]], delays=[2e-5, 1e-5])  # noisy: falls with m
    lib = load_library(str(write_lib(tmp_path, cells=[cell])))
    d, src = lib.delay("MatMul", "fp32", 1, 1, {"m": 64})
    assert src == "table-extrap" and d == pytest.approx(1e-5)


def _error(tmp_path, **overrides) -> str:
    with pytest.raises(SoftsynError) as e:
        load_library(str(write_lib(tmp_path, **overrides)))
    return str(e.value)


def test_errors_name_file_and_key(tmp_path):
    msg = _error(tmp_path, device=None)
    assert "toy.yaml" in msg and "device" in msg and "missing" in msg
    msg = _error(tmp_path, ceilings=dict(CEILINGS, memory_bandwidth=0))
    assert "toy.yaml:" in msg and "ceilings.memory_bandwidth" in msg and "positive" in msg
    msg = _error(tmp_path, ceilings=dict(CEILINGS, launch_overhead=-1e-6))
    assert "ceilings.launch_overhead" in msg
    msg = _error(tmp_path, ceilings=dict(CEILINGS, peak_flops={"fp32": "fast"}))
    assert "ceilings.peak_flops.fp32" in msg
    msg = _error(tmp_path, ceilings=dict(CEILINGS, peak_flops={"fp99": 1e9}))
    assert "ceilings.peak_flops.fp99" in msg and "unknown precision" in msg
    msg = _error(tmp_path, cells=[dict(CELL, delays=[[1e-5, 4e-5]])])
    assert "cells.0.delays" in msg and "3 x 2" in msg
    msg = _error(tmp_path, cells=[dict(CELL, points=[[4, 1, 16], [64, 256]])])
    assert "cells.0.points.0" in msg and "increasing" in msg
    msg = _error(tmp_path, format=2)
    assert "format" in msg
    with pytest.raises(SoftsynError, match="shipped: .*cpu-ort.*h200-ort-cuda, or a path"):
        load_library("no-such-lib")
    with pytest.raises(SoftsynError, match="missing.yaml not found; shipped: "):
        load_library(str(tmp_path / "missing.yaml"))


LINES_LIB = """\
library: toy
format: 1
runtime: onnxruntime 1.31.1
provider: CPUExecutionProvider
device: toy cpu
date: 2026-11-30
command: hand-written for a test
ceilings:
  memory_bandwidth: 1.0e10
  peak_flops: {fp32: 1.0e11}
  launch_overhead: 1.0e-6
cells:
  - op: MatMul
    precision: fp32
    axes: [m]
    points: [[1, 4]]
    delays: [1e-5, 4.0e-5]
"""


def test_errors_name_the_line_of_the_key_or_its_parent(tmp_path):
    """Library errors come from the shared YAML reader: ``file:line: key: what``, the line of the key, or of its
    nearest parent for a key that is missing."""
    path = tmp_path / "lines.yaml"
    with pytest.raises(SoftsynError) as e:
        parse_library(LINES_LIB.replace("launch_overhead: 1.0e-6", "launch_overhead: -1"), path)
    assert str(e.value) == f"{path}:11: ceilings.launch_overhead: must be a positive number (SI units), got -1"
    with pytest.raises(SoftsynError) as e:
        parse_library(LINES_LIB.replace("    axes: [m]\n", ""), path)
    assert str(e.value) == f"{path}:13: cells.0.axes: missing"
    with pytest.raises(SoftsynError) as e:
        parse_library(LINES_LIB.replace("command: hand-written for a test\n", ""), path)
    assert str(e.value).startswith(f"{path}: command: missing: say how")


def test_string_delays_are_numbers_in_the_table(tmp_path):
    """A delay YAML 1.1 reads as a string ("1e-5", no dot) is validated into a float the table looks up."""
    lib = parse_library(LINES_LIB, tmp_path / "lines.yaml")
    cell = lib.cells[0]
    assert cell.delays == [1e-5, 4e-5] and cell.floor == 1e-5
    assert lib.delay("MatMul", "fp32", 1, 1, {"m": 2}) == (pytest.approx(2e-5), "table")


def test_null_run_overhead_falls_back_and_strings_parse(tmp_path):
    text = write_lib(tmp_path).read_text().replace("run_overhead: 2.0e-05", "run_overhead: null")
    text = text.replace("memory_bandwidth: 10000000000.0", "memory_bandwidth: 1e10")  # YAML 1.1 string
    lib = parse_library(text, tmp_path / "x.yaml")
    assert lib.ceilings.run_overhead == lib.ceilings.launch_overhead
    assert lib.ceilings.memory_bandwidth == 1e10


def test_measure_ceilings_quick_cpu(tmp_path):
    from softsyn.characterize.ceilings import measure_ceilings
    from softsyn.characterize.writer import render_library_yaml
    t0 = time.perf_counter()
    lib = measure_ceilings("cpu", quick=True, progress=False)
    assert time.perf_counter() - t0 < 15
    c = lib["ceilings"]
    assert c["memory_bandwidth"] > 1e8
    assert c["peak_flops"]["fp32"] > 1e8
    assert c["peak_flops"]["bf16"] is None  # ORT CPU has no bf16 MatMul kernel
    assert c["launch_overhead"] > 0 and c["run_overhead"] > 0
    assert c["launch_overhead_graph"] is None
    assert lib["provider"] == "CPUExecutionProvider"
    # What it writes loads back as a library.
    loaded = parse_library(render_library_yaml(lib), tmp_path / "m.yaml")
    assert loaded.ceilings.peak_flops["fp32"] == pytest.approx(c["peak_flops"]["fp32"], rel=1e-2)
    assert "bf16" not in loaded.ceilings.peak_flops


def test_a_rewritten_library_keeps_its_serving_host_block_and_cell_attributes(tmp_path):
    """characterize resumes a library by re-rendering it: the serving_host block (bench/host_probe.py's) and a cell's
    node attributes (the CPU's MatMulNBits at accuracy_level 4) survive, as loaded; a malformed attribute is one
    line naming its key."""
    from softsyn.characterize.writer import render_library_yaml

    shipped = load_library("cpu-ort")
    text = render_library_yaml(yaml.safe_load(shipped.path.read_text()))
    again = parse_library(text, tmp_path / "cpu-ort.yaml")
    assert again.serving_host == shipped.serving_host and again.serving_host is not None
    assert again.node_attributes("MatMulNBits", "int8") == {"accuracy_level": 4}
    assert again.node_attributes("MatMul", "fp32") == {}
    bad = text.replace("attributes: {accuracy_level: 4}", "attributes: {accuracy_level: four}", 1)
    with pytest.raises(SoftsynError, match=r"attributes: must be a mapping of node attribute -> integer"):
        parse_library(bad, tmp_path / "bad.yaml")
    for bad in ("{accuracy_level: 4, bits: 2}", "{accuracy_level: 7}"):  # softsyn's own attributes, a bad level
        with pytest.raises(SoftsynError, match=r"attributes: .*valid: accuracy_level in 0\.\.4"):
            parse_library(text.replace("attributes: {accuracy_level: 4}", f"attributes: {bad}", 1), tmp_path / "b.yaml")


def test_measure_ceilings_cuda_without_gpu_is_a_clean_error():
    import shutil
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU may be present: this checks the no-GPU path only")
    from softsyn.characterize.ceilings import measure_ceilings
    with pytest.raises(SoftsynError, match="CUDAExecutionProvider.*session runs on"):
        measure_ceilings("cuda", quick=True, progress=False)


def test_batch_extrapolates_linearly_and_covering_cell_wins(tmp_path):
    base = dict(CELL, axes=["batch", "m"], points=[[1, 16], [1, 16]], delays=[[1e-6, 2e-6], [5e-6, 9e-6]],
                implementation="ort-cpu-batched")
    expert = dict(CELL, axes=["batch", "m"], points=[[16, 1024], [1]], delays=[[5e-6], [5e-4]],
                  implementation="ort-cpu-batched-expert")
    lib = load_library(str(write_lib(tmp_path, cells=[expert, base, CELL])))
    # Above the batch grid: floor + (edge - floor) * batch / edge_batch (independent work per batch item).
    d, src = lib.delay("MatMul", "fp32", 1, 1, {"batch": 64, "m": 16, "k": 64}, implementation="ort-cpu-batched")
    assert src == "table-extrap" and d == pytest.approx(1e-6 + (9e-6 - 1e-6) * 4)
    # The cell whose grid covers the sizes is chosen among cells with the same axes ...
    assert lib.cell_for("MatMul", "fp32", {"batch": 256, "m": 1}).implementation == "ort-cpu-batched-expert"
    assert lib.cell_for("MatMul", "fp32", {"batch": 4, "m": 16}).implementation == "ort-cpu-batched"
    # ... else the nearest one; never the plain MatMul cell (other axes) for batched sizes.
    assert lib.cell_for("MatMul", "fp32", {"batch": 32, "m": 16, "k": 64}).implementation == "ort-cpu-batched"
    assert lib.cell_for("MatMul", "fp32", {"batch": 4096, "m": 1, "k": 64}).implementation == "ort-cpu-batched-expert"
    assert lib.cell_for("MatMul", "fp32", {"m": 4, "k": 64}).implementation == "ort-cpu"
