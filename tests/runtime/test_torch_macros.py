"""A torch package's macro cells (softsyn.runtime.torch_macros, softsyn.emit.torch_characterise, softsyn.timing.macro,
reports.macro_timing): profiled kernels summed per source module instance, mapped to netlist cells, stored with the
artifact and timed as a path; what maps to nothing reported as such."""
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from softsyn.cli import main
from softsyn.emit.torch_characterise import NO_MAP, NOT_SEEN, macro_group
from softsyn.errors import SoftsynError
from softsyn.results.analysis import TimingPath
from softsyn.runtime.torch_macros import (MACROS_FILE, UNATTRIBUTED, MacroLibrary, aggregate, call_instance, cover,
                                          macro_instance, read_library, write_library)
from softsyn.runtime.torch_profile import Profile, cpu_records
from softsyn.runtime.torch_provenance import KernelCall, read_calls
from softsyn.timing.macro import HOST, macro_path

CALLS = [KernelCall("cpp_fused_norm_0", ("model.layers.0.input_layernorm", "model.embed_tokens"), (6, 1)),
         KernelCall("aoti_torch_cpu_mm_out", ("model.layers.0.self_attn.packed_q_k_v.linear",), (1,)),
         KernelCall("aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu",
                    ("model.layers.0.self_attn", "model.rotary_emb"), (30, 2)),
         KernelCall("aoti_torch_cpu_mm_out", ("model.layers.0.self_attn.o_proj",), (1,)),
         KernelCall("cpp_fused_norm_1", ("model.layers.0", "model.layers.0.post_attention_layernorm",
                                         "model.layers.0.self_attn.o_proj"), (2, 6, 1)),
         KernelCall("aoti_torch_cpu_mm_out", ("lm_head",), (1,))]
STEP = [("cpp_fused_norm_0", 1e-6), ("aoti_torch_cpu_mm_out", 10e-6),
        ("aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu", 20e-6), ("aoti_torch_cpu_mm_out", 5e-6),
        ("cpp_fused_norm_1", 2e-6), ("aoti_torch_cpu_mm_out", 50e-6)]


def test_module_paths_and_netlist_scopes_read_as_the_same_instances():
    assert macro_instance("model.layers.3.mlp.down_proj") == "model.layers.3.mlp"
    assert macro_instance("model.layers.3.self_attn.o_proj/MatMul_4") == "model.layers.3.self_attn"
    assert macro_instance("model.layers.3") == "model.layers.3"
    assert macro_instance("model.norm") == "model.norm" and macro_instance("lm_head") == "lm_head"
    assert macro_instance("model.rotary_emb/node_Cos") == "model.rotary_emb" and macro_instance("") == ""


def test_a_fused_kernel_is_the_instance_most_of_its_nodes_came_from():
    """The norm kernel that recomputes the residual stream names the embedding too: it is the norm's; a layer's own
    adds count only when alone; every instance it computes is kept; a map without counts joins them."""
    assert call_instance(CALLS[0]) == ("model.layers.0.input_layernorm",
                                       ("model.layers.0.input_layernorm", "model.embed_tokens"))
    assert call_instance(CALLS[4])[0] == "model.layers.0.post_attention_layernorm"
    assert call_instance(KernelCall("cpp_add_2", ("model.layers.1",), (2,)))[0] == "model.layers.1"
    assert call_instance(KernelCall("cpp_x", ("model.layers.0.mlp", "model.norm")))[0] == "model.layers.0.mlp+model.norm"
    assert call_instance(KernelCall("cpp_y", ()))[0] == "(no module)"
    assert CALLS[0].kind == "input_layernorm" and KernelCall("t", ("model.norm", "lm_head")).kind == "lm_head+norm"


def test_cpu_records_keep_the_package_s_kernels_without_their_graph_prefix():
    events = [("graph_0_cpp_fused_norm_0", 1e-6), ("aoti_torch_cpu_mm_out", 9e-6), ("aten::copy_", 3e-6),
              ("aten::mm", 8e-6)]
    assert cpu_records(events) == [("cpp_fused_norm_0", 1e-6), ("aoti_torch_cpu_mm_out", 9e-6)]


def test_profiled_kernels_are_summed_per_instance_and_step_in_launch_order():
    """Two steps of CPU records: each extern record goes to its own call by name (attention's then o_proj's,
    back to back), times and counts per step; a record no call names is unattributed, kept."""
    macros, unattributed = aggregate(STEP * 2 + [("cpp_fused_other_9", 4e-6)], 2, CALLS, named=True)
    assert [m.instance for m in macros] == ["model.layers.0.input_layernorm", "model.layers.0.self_attn",
                                            "model.layers.0.post_attention_layernorm", "lm_head"]
    attn = macros[1]
    assert attn.kernels == 3 and attn.seconds == pytest.approx(35e-6)
    assert attn.kernel_names == ("aoti_torch_cpu_mm_out", "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu")
    assert set(attn.modules) == {"model.layers.0.self_attn", "model.rotary_emb"}
    assert macros[3].seconds == pytest.approx(50e-6) and macros[3].kernels == 1
    assert unattributed.instance == UNATTRIBUTED and unattributed.kernels == 0.5
    assert unattributed.seconds == pytest.approx(2e-6) and unattributed.kernel_names == ("cpp_fused_other_9",)
    # nothing unattributed: the row is still there, empty
    assert aggregate(STEP, 1, CALLS, named=True)[1].kernels == 0


def test_netlist_cells_are_covered_once_and_the_rest_reported():
    """A cell goes to the macro named by its instance (the rotary cells to the attention that computes them, the
    residual add to the norm that fuses it); each macro's est sums its cells' delays at the group; a cell of no
    macro's instance is uncovered; a macro of no cell keeps est None."""
    macros, _ = aggregate(STEP + [("cpp_fused_z", 1e-6)], 1,
                          CALLS + [KernelCall("cpp_fused_z", ("model.extra",), (1,))], named=True)
    cells = [{"name": "emb", "hierarchy": "model.embed_tokens", "delay": {"decode": 1e-6}},
             {"name": "norm", "hierarchy": "model.layers.0.input_layernorm", "delay": {"decode": 2e-6}},
             {"name": "q", "hierarchy": "model.layers.0.self_attn.q_proj", "delay": {"decode": 3e-6}},
             {"name": "cos", "hierarchy": "model.rotary_emb", "delay": {"decode": 4e-6}},
             {"name": "add", "hierarchy": "model.layers.0", "delay": {"decode": 5e-6}},
             {"name": "head", "hierarchy": "lm_head", "delay": {"decode": 6e-6}},
             {"name": "shape", "hierarchy": "", "delay": {"decode": 7e-6}}]
    covered, uncovered = cover(macros, cells, "decode")
    by = {m.instance: m for m in covered}
    assert by["model.layers.0.input_layernorm"].cells == ("emb", "norm")
    assert by["model.layers.0.self_attn"].cells == ("q", "cos")
    assert by["model.layers.0.post_attention_layernorm"].cells == ("add",)
    assert by["lm_head"].est == pytest.approx(6e-6) and by["model.layers.0.self_attn"].est == pytest.approx(7e-6)
    assert by["model.extra"].cells == () and by["model.extra"].est is None
    assert uncovered == ("shape",)


def _critical():
    return TimingPath(group="decode", scenario=SimpleNamespace(description="decode"), startpoint="input_ids",
                      endpoint="logits", clock_period=2e-3, input_delay=1e-3, clock_uncertainty=1e-4,
                      output_delay=1e-4, points=[], arrival=1.1e-3, required=1.8e-3, slack=0.7e-3)


def test_the_macro_path_is_the_cells_then_unattributed_then_the_host_under_the_group_s_clock():
    macros, unattributed = aggregate(STEP + [("cpp_fused_other_9", 4e-6)], 1, CALLS, named=True)
    group = macro_group("decode", {"seq": 1}, "model.pt2", Profile(tuple(STEP + [("cpp_fused_other_9", 4e-6)]), 1,
                                                                  True), calls=CALLS, cells=[], step=200e-6)
    path = macro_path(_critical(), group)
    assert [p.name for p in path.points] == [m.instance for m in macros] + [UNATTRIBUTED, HOST]
    assert all(p.source == "measured" for p in path.points)
    assert path.points[-1].incr == pytest.approx(200e-6 - 92e-6)
    assert path.arrival == pytest.approx(1e-3 + 200e-6) and path.slack == pytest.approx(1.8e-3 - 1.2e-3)
    # kernels profiled above the separately timed step (88 us in 44): scaled to it, the host point 0, the ratios kept
    fast = macro_group("decode", {"seq": 1}, "model.pt2", Profile(tuple(STEP), 1, True), calls=CALLS, cells=[],
                       step=44e-6)
    assert fast.scale == pytest.approx(0.5) and fast.kernel_seconds == pytest.approx(44e-6)
    assert fast.macros[-1].seconds == pytest.approx(25e-6)
    assert macro_path(_critical(), fast).points[-1].incr == 0
    assert macro_path(_critical(), fast).arrival == pytest.approx(1e-3 + 44e-6)


def test_a_group_the_profiler_cannot_see_is_not_characterised_and_says_why():
    """No kernel seen (a CPU package without records): no macro cells, no path, the reason kept; a package without
    a map likewise."""
    blind = macro_group("decode", {"seq": 1}, "model.pt2", Profile((), 5, True), calls=CALLS, cells=[], step=1e-3)
    assert blind.problem == NOT_SEEN and blind.macros == () and macro_path(_critical(), blind) is None
    assert macro_group("decode", {}, "model.pt2", Profile(tuple(STEP), 1, True), calls=[], cells=[],
                       step=1e-3).problem == NO_MAP


def test_the_macro_file_reads_back_and_a_bad_one_is_one_line_naming_the_key(tmp_path):
    group = macro_group("decode", {"batch": 1, "seq": 1}, "model.pt2", Profile(tuple(STEP), 1, True), calls=CALLS,
                        cells=[{"name": "head", "hierarchy": "lm_head", "delay": {"decode": 6e-6}}], step=1e-4)
    library = MacroLibrary(target="cpu-torch", device="test CPU", torch="2.13", date="2026-12-06T00:00:00+00:00",
                           method="synthetic", groups=(group,), library="cpu-ort")
    write_library(tmp_path / MACROS_FILE, library)
    assert read_library(tmp_path) == library
    data = json.loads((tmp_path / MACROS_FILE).read_text())
    assert data["label"] == "measured" and data["units"] == {"time": "s"} and list(data["groups"]) == ["decode"]
    data["groups"]["decode"]["macros"][1]["seconds"] = "fast"
    (tmp_path / MACROS_FILE).write_text(json.dumps(data))
    with pytest.raises(SoftsynError, match=r"torch_macros.json: groups.decode.macros\[1\].seconds: not a number"):
        read_library(tmp_path)
    assert read_library(tmp_path / "absent") is None


def test_the_compile_characterises_every_group_s_macro_cells(tiny_torch_artifact):
    """zoo:qwen3-tiny on cpu-torch: every path group characterised on this CPU (the package's kernels run inside
    profiler records); every macro cell is a module instance of the netlist, measured, covering netlist cells that
    exist; its kernels are calls of the map; the unattributed row and the uncovered cells are listed."""
    library = read_library(tiny_torch_artifact)
    netlist = json.loads((tiny_torch_artifact / "netlist.json").read_text())
    names = {c["name"] for c in netlist["cells"]}
    scopes = {macro_instance(c["hierarchy"]) for c in netlist["cells"]}
    calls = {c.kernel for c in read_calls(tiny_torch_artifact)}
    assert library is not None and [g.name for g in library.groups] == ["prefill", "decode"]
    assert library.target == "cpu-torch" and library.library == "cpu-ort" and library.date
    for g in library.groups:
        assert g.problem == "" and g.step > 0 and g.dims == netlist["groups"][g.name]
        instances = [m.instance for m in g.macros]
        assert {f"model.layers.{i}.{m}" for i in range(2) for m in ("self_attn", "mlp")} | {"lm_head"} <= set(instances)
        assert set(instances) <= scopes
        for m in g.macros:
            assert m.seconds > 0 and m.kernels >= 1 and set(m.kernel_names) <= calls
            assert m.cells and set(m.cells) <= names and m.est is not None
        covered = [c for m in g.macros for c in m.cells]
        assert len(covered) == len(set(covered)) and set(covered) | set(g.uncovered) == names
        assert g.unattributed.instance == UNATTRIBUTED and g.unattributed.kernels == 0  # every record is a call's
    assert "runtime/torch_macros.json: decode: " in (tiny_torch_artifact / "compile.log").read_text()


def test_report_timing_adds_the_paths_through_the_macro_cells(tiny_torch_artifact):
    """`softsyn report timing DIR`: the ORT library's paths, then one path per group through the macro cells
    (measured), each with its macro table beside the library's estimate, and what covers nothing."""
    result = CliRunner().invoke(main, ["report", "timing", str(tiny_torch_artifact), "--no-fold"])
    assert result.exit_code == 0, result.output
    ort, _, macro = result.output.partition("Report : timing (macro cells)")
    assert "Library: cpu-ort" in ort and "(measured)" not in ort
    assert "runtime/torch_macros.json (cpu-torch; measured on" in macro
    for group in ("prefill", "decode"):
        assert f"Path Group: {group}" in macro and f"Macro cells of '{group}'" in macro
    rows = [line for line in macro.splitlines() if line.strip().startswith("model.layers.1.mlp ")]
    assert sum("macro: 3 kernels" in r and "(measured)" in r for r in rows) == 2  # its stage in each path
    assert macro.count("Predicted from macro cells (measured)") == 2 and "from the ORT library (est)" in macro
    assert macro.count("(outside kernels)") == 2 and "Netlist cells no macro cell covers: 3" in macro
    assert (tiny_torch_artifact / "reports" / "torch_macros.rpt").read_text().startswith("*" * 40)
