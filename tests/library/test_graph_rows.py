"""A graph table measured at a batch of rows (m up to GRAPH_MAX_ROWS) times batched decode steps between its rows;
more rows than it measured fall back to the eager table (no extrapolated graph time)."""
import dataclasses

import pytest

from softsyn.library import Cell, load_library
from softsyn.library.model import GRAPH_MAX_ROWS, GRAPH_SUFFIX


def test_a_multi_row_graph_table_interpolates_and_stops_at_its_last_row():
    library = load_library("h200-ort-cuda")
    table = Cell(op="MatMul", precision="fp16", implementation="ort-cuda" + GRAPH_SUFFIX, axes=["m", "n", "k"],
                 points=[[1.0, float(GRAPH_MAX_ROWS)], [64.0, 4096.0], [64.0, 4096.0]],
                 delays=[[[3e-6, 4e-6], [5e-6, 6e-6]], [[6e-6, 8e-6], [10e-6, 12e-6]]])
    eager = [c for c in library.cells if not c.implementation.endswith(GRAPH_SUFFIX)]
    graphed = dataclasses.replace(library, cells=[*eager, table])
    assert graphed.graph_delay("MatMul", "fp16", {"m": 1, "n": 64, "k": 4096}) == pytest.approx(4e-6)
    assert graphed.graph_delay("MatMul", "fp16", {"m": 16, "n": 64, "k": 4096}) == pytest.approx(8e-6)
    between = graphed.graph_delay("MatMul", "fp16", {"m": 4, "n": 64, "k": 4096})
    assert 4e-6 < between < 8e-6
    assert graphed.graph_delay("MatMul", "fp16", {"m": 32, "n": 64, "k": 4096}) is None  # past its rows


def test_a_gpu_attention_table_serves_a_batch_side_by_side_up_to_the_memory_bound():
    """A batch-1 attention table serves batch N on a GPU as one launch: at least its batch-1 delay and the floor plus
    the bytes at the measured bandwidth, at most the linear rule's N-fold work; on a CPU the linear rule holds."""
    gpu, cpu = load_library("h200-ort-cuda"), load_library("cpu-ort")
    sizes = {"q_tokens": 1, "kv_len": 1536, "heads": 16, "kv_heads": 8, "head_dim": 128}
    kv = 2 * 1536 * 8 * 128 * 2  # K and V of one sequence, fp16
    for library in (gpu, cpu):
        one, _ = library.delay("GroupQueryAttention", "fp16", 0.0, kv, {**sizes, "batch": 1})
        cell = library.cell_for("GroupQueryAttention", "fp16", {**sizes, "batch": 16})
        linear = cell.floor + (one - cell.floor) * 16
        got, _ = library.delay("GroupQueryAttention", "fp16", 0.0, 16 * kv, {**sizes, "batch": 16})
        if library is gpu:
            bound = max(one, cell.floor + 16 * kv / gpu.ceilings.memory_bandwidth)
            assert got == pytest.approx(min(linear, bound)) and got < 0.5 * linear
            graphed = gpu.graph_delay("GroupQueryAttention", "fp16", {**sizes, "batch": 16}, 16 * kv)
            assert graphed < 4 * gpu.graph_delay("GroupQueryAttention", "fp16", {**sizes, "batch": 1}, kv)  # linear: ~10x
        else:
            assert got == pytest.approx(linear)
