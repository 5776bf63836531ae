"""softsyn.progress: a step says what it took on stderr when it took long enough, nothing under -q or when short;
the compile log's elapsed is the command's wall time (from the start it is given)."""
import time

import pytest

from paths import ROOT
from softsyn import progress


@pytest.fixture
def every_step(monkeypatch):
    monkeypatch.setattr(progress, "QUIET_BELOW_S", 0.0)


def test_a_step_off_a_terminal_prints_its_end_line(capsys, every_step):
    with progress.step("exporting x", done="exported x") as step:
        step.advance()
    err = capsys.readouterr().err
    assert err.startswith("[softsyn] exported x: ") and err.endswith(" s\n") and "\r" not in err


def test_quiet_and_short_steps_print_nothing(capsys):
    with progress.step("quick"):  # under QUIET_BELOW_S
        pass
    with progress.step("silenced", enabled=False):
        time.sleep(0.01)
    assert capsys.readouterr().err == ""


def test_a_failed_step_says_it_stopped(capsys, every_step):
    with pytest.raises(ValueError), progress.step("fusing"):
        raise ValueError("boom")
    assert capsys.readouterr().err.startswith("[softsyn] fusing (stopped): ")


def test_a_counted_step_keeps_its_count(every_step):
    with progress.step("sensitivity", total=3) as step:
        for _ in range(3):
            step.advance()
    assert (step.done, step.total) == (3, 3)


def test_the_compile_log_counts_from_the_command_start(cache_dir, tmp_path):
    """Reading the design (an export, seeded weights) is inside the first row's elapsed, emit is the last row."""

    from softsyn.design import Design
    from softsyn.flow.compile import compile_design
    from softsyn.flow.verify import reference_record

    cons = ROOT / "constraints" / "cpu-tiny.yaml"
    design = Design.load("zoo:qwen3-tiny", cons, cache_dir=cache_dir, progress=False)
    started = time.perf_counter() - 50.0  # as if reading the design had taken 50 s
    compile_design(design, "low", tmp_path / "out", reference_record("zoo:qwen3-tiny", design.netlist),
                   started=started)
    log = (tmp_path / "out" / "compile.log").read_text()
    rows = [line.split() for line in log.splitlines() if line.strip()[:1].isdigit()]
    assert rows[0][1] == "elaborate" and rows[0][0] >= "0:00:50" and rows[-1][1] == "emit"
    assert "note: elaborate's elapsed includes starting up and reading the design (50." in log
