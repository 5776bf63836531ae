"""The compile loop's accuracy estimate: the combination rule (search.map_error), the ILP under it, and the
sensitivities behind it: per cell, per role for large designs, on the CPU view of a CUDA design on a machine
without the device."""
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passes import effort
from passes.optimize import search

CUDA_CONSTRAINTS = ("target: h200-ort-cuda\nworkload: {batch: 1, prompt_len: 32, context_len: 64}\npath_groups:\n"
                    "  prefill: {kind: prefill, clock_period: 100ms, dims: {batch: 1, seq: 32, past: 0}}\n"
                    "  decode: {kind: decode, clock_period: 10us, dims: {batch: 1, seq: 1, past: 64}}\n"
                    "accuracy: {max_rel_error: 50%}\nprecision: {allowed: [fp16, int8, int4], default: fp16}\n")


def test_a_maps_error_is_the_root_sum_of_squares_times_the_safety_factor():
    assert search.map_error([]) == 0.0
    assert search.map_error([3e-2, 4e-2]) == pytest.approx(search.ERROR_SAFETY * 5e-2)
    assert search.map_error([0.02]) == pytest.approx(search.ERROR_SAFETY * 0.02)  # one cell: its error, with margin
    # a group of n cells measured at once: each cell's share makes the whole group estimate the safety factor x it
    share = search.cell_error(0.09, 9)
    assert share == pytest.approx(0.03)
    assert search.map_error([share] * 9) == pytest.approx(search.ERROR_SAFETY * 0.09)
    assert str(search.ERROR_SAFETY) in search.ESTIMATE_RULE


def _problem(errors, saving, slack, budget):
    """Cells c0.. with an int4 option `saving[i]` s faster in one group (decode) at `errors[i]` error."""
    cells = tuple(f"c{i}" for i in range(len(errors)))
    return search.Problem(cells, {c: ("fp16", "int4") for c in cells},
                          {"decode": {c: {"fp16": 1e-3, "int4": 1e-3 - s} for c, s in zip(cells, saving)}},
                          {"decode": slack}, {"decode": 1.0},
                          {c: {"fp16": 0.0, "int4": e} for c, e in zip(cells, errors)},
                          {c: {"fp16": 2e6, "int4": 5e5} for c in cells}, budget)


def test_the_ilp_admits_what_the_rss_admits_and_the_sum_would_not():
    """Four cells of 5 % each, a 13 % budget: the sum would allow two, the RSS x 1.25 (12.5 %) all four, which the
    miss needs; a 12 % budget allows three (10.8 %), and neither search exceeds it."""
    assert search.ERROR_SAFETY == 1.25  # the figures below are worked for it
    problem = _problem([0.05] * 4, [1e-4] * 4, -4e-4, budget=0.13)
    for found in (search.greedy(problem), search.ilp(problem)):
        assert set(found.mapping.values()) == {"int4"} and found.slack["decode"] >= 0
        assert found.error == pytest.approx(search.ERROR_SAFETY * 0.05 * 2) and found.error <= problem.budget
    tight = _problem([0.05] * 4, [1e-4] * 4, -4e-4, budget=0.12)
    for found in (search.greedy(tight), search.ilp(tight)):
        assert list(found.mapping.values()).count("int4") == 3  # 1.25 x 5 % x sqrt(3) = 10.8 % <= 12 % < 12.5 %
        assert found.error <= tight.budget


@st.composite
def small_problems(draw):
    n = draw(st.integers(1, 4))
    errors = [draw(st.floats(1e-3, 0.2)) for _ in range(n)]
    saving = [draw(st.floats(1e-6, 5e-4)) for _ in range(n)]
    return _problem(errors, saving, draw(st.floats(-1e-3, 1e-4)), draw(st.floats(0.0, 0.4)))


@settings(max_examples=25, deadline=None)
@given(small_problems())
def test_the_ilp_is_the_cheapest_map_within_the_rss_budget(problem):
    """Every map enumerated: the ILP's is within the budget by map_error and no map within it costs less."""
    exact = search.ilp(problem)
    assert exact.error <= problem.budget * (1 + 1e-9) and search.within_budget(problem, exact.mapping)
    for choice in itertools.product(*(problem.options[c] for c in problem.cells)):
        mapping = dict(zip(problem.cells, choice))
        cost, _, error, _ = search.evaluate(problem, mapping)
        assert search.within_budget(problem, mapping) == (error <= problem.budget * (1 + 1e-9))
        if error <= problem.budget:
            assert exact.cost.scalar() <= cost.scalar() + 1e-7 * abs(cost.scalar()) + 1e-6


@pytest.fixture(scope="module")
def cuda_tiny(cache_dir, tmp_path_factory):
    """qwen3-tiny after effort low's passes for the H200 library (its GQA absorbs the q/k norms), int4/int8 allowed."""
    import passes
    from softsyn.design import Design

    cons = tmp_path_factory.mktemp("cuda-tiny") / "c.yaml"
    cons.write_text(CUDA_CONSTRAINTS)
    design = Design.load("zoo:qwen3-tiny", cons, cache_dir=cache_dir, progress=False)
    for step in effort("low").steps:
        passes.run_pass(design, step.pass_name, dict(step.options))
    return design


def test_a_large_design_is_measured_per_role_on_the_cpu_view_without_an_error(cuda_tiny, monkeypatch, capfd):
    """Over the per-cell limit the cells are measured per role (one run per role and precision), here on the CPU
    view of the CUDA design (no device on this machine): no ORT error printed, the result cached, the label said."""
    from passes import optimize
    from passes.optimize import mapping as mp
    from passes.optimize import sensitivity

    cands, _ = mp.candidates(cuda_tiny)
    assert sensitivity.target_provider(cuda_tiny) == "cpu"  # no H200 here: ORT CPU, through the CPU view
    groups = sensitivity.roles(cuda_tiny, cands)
    layers = cuda_tiny.netlist.config["num_layers"]
    assert groups["model.layers.mlp.down_proj"] and len(groups["model.layers.mlp.down_proj"]) == layers
    assert [len(v) for k, v in groups.items() if k == "lm_head"] == [1]
    assert any("(packed" in role for role in groups)  # fusion's packed QKV / gate-up are roles of their own
    assert sum(len(v) for v in groups.values()) == len(cands)

    monkeypatch.setattr(optimize, "MEASURE_LIMIT", 0)
    errors, how, checkable = optimize.sensitivities(cuda_tiny, cands)
    assert checkable and how.startswith("measured per role (not per cell)")
    assert "CPU view: q/k norms outside" in how and f"{len(groups)} role groups" in how
    assert f"{len(groups) * 2} runs new" in how
    err = capfd.readouterr().err
    assert "[E:onnxruntime" not in err and "cannot run" not in err
    for role, cells in groups.items():  # one share per role: the group's error / sqrt(cells)
        assert len({errors[c.name]["int4"] for c in cells}) == 1 and errors[cells[0].name]["int4"] > 0
    down = groups["model.layers.mlp.down_proj"]
    measured = sensitivity.Runner(cuda_tiny).error({c.name: "int4" for c in down})  # the group's run, again
    assert errors[down[0].name]["int4"] == pytest.approx(measured / math.sqrt(len(down)), rel=1e-6)
    again = sensitivity.measure_per_role(cuda_tiny, cands)
    assert again[0] == errors and "0 runs new" in again[1]
    fallback = sensitivity.Runner(cuda_tiny, "cuda")  # asked for the device where none is: the CPU view, said
    assert fallback.provider == "cpu" and "the CUDA session did not open" in fallback.where
    assert fallback.error({c.name: "int4" for c in down}) == pytest.approx(measured, rel=1e-6)


def test_fp8_cells_are_measured_on_the_cpu_view_between_int8_and_int4(cuda_tiny, monkeypatch):
    """fp8 allowed and characterised (a library copy with a stand-in fp8 cell): the loop offers it, and the sensitivity
    runner quantises the cell to MatMulBlockQuantizedFp8Weight and runs it on ORT CPU through the fp8 view (no CPU
    kernel); e4m3's 3 mantissa bits put its error between int8's and int4's, as the prior assumes."""
    import dataclasses

    from passes.optimize import mapping as mp
    from passes.optimize import sensitivity

    fake = [dataclasses.replace(c, op=mp.FP8_OP, precision="fp8") for c in cuda_tiny.library.cells
            if c.op == "MatMulNBits" and c.precision == "int8"]
    cons = cuda_tiny.constraints
    monkeypatch.setattr(cuda_tiny, "library", dataclasses.replace(cuda_tiny.library, cells=[*cuda_tiny.library.cells, *fake]))
    monkeypatch.setattr(cuda_tiny, "constraints", dataclasses.replace(cons, precision=dataclasses.replace(
        cons.precision, allowed=(*cons.precision.allowed, "fp8"))))
    cands, skipped = mp.candidates(cuda_tiny)
    assert "fp8" not in skipped and all(c.options == ("fp16", "int4", "int8", "fp8") for c in cands)
    cell = next(c for c in cands if c.hierarchy.endswith("mlp.down_proj"))
    runner = sensitivity.Runner(cuda_tiny, "cpu")
    assert runner.where.startswith("ORT CPU") and runner.error({}) == 0.0
    errors = {p: runner.error({cell.name: p}) for p in ("int8", "fp8", "int4")}
    assert 0 < errors["int8"] < errors["fp8"] < errors["int4"], errors
    assert not any(n.op_type == mp.FP8_OP for n in runner.proto.graph.node)  # the proto is restored after the run
