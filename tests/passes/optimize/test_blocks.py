"""nbits_block: an int4/int8 cell is quantised at the block the library times fastest for its shape, the finer block
when the times are within BLOCK_TIE (it is the more accurate), BLOCK without a block axis."""
import dataclasses

from passes.optimize import mapping as mp
from softsyn.library import Cell, load_library


def _library(delays_by_block_small, delays_by_block_large):
    base = load_library("cpu-ort")
    # axes m, n, k, block: one decode row, two widths (64: the small shape, 4096: the large), blocks 32/64/128
    delays = [[[list(delays_by_block_small), list(delays_by_block_small)],
               [list(delays_by_block_large), list(delays_by_block_large)]]]
    cell = Cell(op="MatMulNBits", precision="int4", implementation="ort-cpu", axes=["m", "n", "k", "block"],
                points=[[1.0], [64.0, 4096.0], [64.0, 4096.0], [32.0, 64.0, 128.0]], delays=delays)
    return dataclasses.replace(base, cells=[c for c in base.cells if c.op != "MatMulNBits"] + [cell])


def test_the_fastest_block_per_shape_ties_to_the_finer():
    lib = _library((10e-6, 9.9e-6, 12e-6), (20e-6, 15e-6, 8e-6))
    assert mp.nbits_block(lib, "int4", 64, 64) == 32  # 10 us within 3 % of 9.9: the finer block
    assert mp.nbits_block(lib, "int4", 4096, 4096) == 128
    assert mp.nbits_block(lib, "int8", 4096, 4096) == mp.BLOCK  # no int8 cell with a block axis
    assert mp.nbits_block(None, "int4", 4096, 4096) == mp.BLOCK


def test_a_candidate_is_timed_and_sized_at_its_block():
    cand = mp.Candidate("w", "", 4096, 4096, "fp16", ("fp16", "int4"), 4096 * 4096, blocks=(("int4", 128),))
    assert cand.block("int4") == 128 and cand.block("int8") == mp.BLOCK
    assert cand.weight_bytes("int4", 2) == 4096 * 4096 / 2 + 4096 * (4096 // 128) * 2
