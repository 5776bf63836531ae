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
