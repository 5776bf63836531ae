"""`softsyn run` says where TTFT and TPOT go: each step's phases sum to it, the prefill timed is never the prompt
length's first run on the session (counted through a session wrapper, independent of the Generator's own count),
a cold one is reported apart, and the step times `softsyn signoff` measured for the same artifact sit beside them."""
from __future__ import annotations

import json
import shutil

import pytest

from softsyn.cli import run as cli_run
from softsyn.flow import run as run_flow
from softsyn.flow.run import RunSettings
from softsyn.runtime.generate import PHASES
from reports.run import report_run


class RecordingBinding:
    """An IOBinding that remembers the input_ids shape bound to it."""

    def __init__(self, inner):
        self.inner, self.ids = inner, None

    def bind_ortvalue_input(self, name, value):
        if name == "input_ids":
            self.ids = tuple(value.shape())
        self.inner.bind_ortvalue_input(name, value)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class CountingSession:
    """A session whose run calls are recorded by the input_ids shape they ran."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def io_binding(self):
        return RecordingBinding(self.inner.io_binding())

    def run_with_iobinding(self, binding, options=None):
        self.calls.append(binding.ids)
        self.inner.run_with_iobinding(binding.inner, options)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def counted_run(monkeypatch, directory, settings):
    sessions = []

    def counting(model, options):
        sess, changed = view(model, options)
        sessions.append(CountingSession(sess))
        return sessions[0], changed

    view = run_flow.cpu_view_session
    monkeypatch.setattr(run_flow, "cpu_view_session", counting)
    return run_flow.run(directory, settings, show_progress=False), sessions[0].calls


@pytest.mark.parametrize("warmup", [1, 0])
def test_the_timed_prefill_follows_a_run_of_its_shape_or_says_it_is_cold(tiny_cpu_artifact, monkeypatch, warmup):
    gen, runs = 4, 2
    result, calls = counted_run(monkeypatch, tiny_cpu_artifact, RunSettings(prompt_len=16, gen=gen, runs=runs,
                                                                             warmup=warmup))
    assert len(calls) == (warmup + runs) * gen and calls.count((1, 16)) == warmup + runs
    first_timed = warmup * gen  # every generation: one prefill, then gen - 1 decode steps
    assert calls[first_timed] == (1, 16)
    assert ((1, 16) in calls[:first_timed]) == (warmup > 0)  # the wrapper's count: the shape ran before, or not
    assert [g.cold for g in result.warmups + result.generations] == [True] + [False] * (warmup + runs - 1)
    text = report_run(result)
    assert ("Warm-up 1 (untimed, not in TTFT): prefill" in text) == (warmup > 0)
    assert ("the first run of this prompt length on the session (cold)" in text) == (warmup > 0)
    assert ("Note: a timed prefill was the first run of its prompt length" in text) == (warmup == 0)
    assert result.to_dict()["cold_ttft"] == (warmup == 0)


def test_each_step_is_the_sum_of_its_named_phases(tiny_cpu_artifact, capsys):
    with pytest.raises(SystemExit):
        cli_run(["run", str(tiny_cpu_artifact), "--prompt-len", "16", "--gen", "5", "--runs", "3", "--json", "-q"])
    data = json.loads(capsys.readouterr().out)
    assert list(data["phases"]) == list(PHASES) == ["inputs", "run", "readback"]
    for key, samples in (("ttft", 3), ("tpot", 12)):
        row, medians = data["breakdown"][key]["median_sample"], data["breakdown"][key]["phase_medians"]
        assert row["total"] == pytest.approx(sum(row[p] for p in PHASES), rel=1e-9)
        assert all(row[p] > 0 for p in PHASES) and medians["sample"] == f"median of {samples}"
    assert data["breakdown"]["ttft"]["median_sample"]["total"] in data["ttft_runs"] and len(data["ttft_runs"]) == 3
    assert sorted(data["ttft_runs"])[1] == data["ttft"]["median"]  # three runs: the median-ranked one is the median
    assert [(w["warmup"], w["cold"]) for w in data["warmups"]] == [(1, True), (2, False)]  # the default: two
    assert data["warmups"][0]["ttft"] == pytest.approx(sum(data["warmups"][0][p] for p in PHASES), rel=1e-9)


def test_the_report_names_each_phase_and_the_signed_off_steps(tiny_cpu_artifact, tmp_path, capsys):
    directory = tmp_path / "tiny"
    shutil.copytree(tiny_cpu_artifact, directory)

    def softsyn(*args):
        with pytest.raises(SystemExit) as exc:
            cli_run([str(a) for a in args])
        return exc.value.code, capsys.readouterr().out

    code, out = softsyn("run", directory, "--gen", 4, "--runs", 1, "-q")
    assert code == 0 and "Signed off (signoff/signoff.json): none to compare: no softsyn signoff of DIR yet" in out
    for name in PHASES:
        assert f"\n  {name}: " in out  # what each phase covers
    assert "Prefill (TTFT) " in out and " ms = run call " in out and " + inputs " in out and " + readback " in out
    assert "Decode (TPOT) " in out
    code, _ = softsyn("signoff", directory, "--runs", 3, "--profile-runs", 3, "-q")
    assert code in (0, 1)  # 1: a budget violated on a busy machine; the step times are written either way
    code, out = softsyn("run", directory, "--gen", 4, "--runs", 1, "-q")  # prompt 128: cpu-tiny.yaml's prefill
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Signed off (signoff/signoff.json, "))
    prefill, decode = lines[start + 1], lines[start + 2]
    assert prefill.startswith("  prefill (batch 1, seq 128, past 0): ") and "TTFT " in prefill and "x it, its run call" in prefill
    assert decode.startswith("  decode (batch 1, seq 1, past 256): ") and "not this run's step" in decode
    code, out = softsyn("run", directory, "--gen", 4, "--runs", 1, "--prompt-len", 64, "--json", "-q")
    groups = {g["group"]: g["same_step"] for g in json.loads(out)["signed_off"]["groups"]}
    assert groups == {"prefill": False, "decode": False}


def test_a_malformed_signoff_file_is_named_never_a_failed_run(tmp_path):
    # DIR/signoff/signoff.json is untrusted: unreadable JSON is a problem line, entries of the wrong shape are skipped
    from softsyn.flow.run_phases import signed_off

    (tmp_path / "signoff").mkdir()
    target = tmp_path / "signoff" / "signoff.json"
    target.write_text("{not json")
    assert signed_off(tmp_path, "CPUExecutionProvider", 128, 4)["problem"].startswith("not readable (")
    target.write_text(json.dumps({"provider": "CPUExecutionProvider", "groups": [
        5, {"name": "x", "dims": 5}, {"name": "y", "dims": {"seq": "128"}, "measured_median": 1e-3},
        {"name": "prefill", "dims": {"batch": 1, "seq": 128, "past": 0}, "measured_median": 2e-3}]}))
    got = signed_off(tmp_path, "CPUExecutionProvider", 128, 4)
    assert got["problem"] is None and [(g["group"], g["kind"], g["same_step"]) for g in got["groups"]] == [
        ("prefill", "prefill", True)]
    target.write_text(json.dumps({"provider": "CPUExecutionProvider", "groups": {"a": 1}}))
    assert signed_off(tmp_path, "CPUExecutionProvider", 128, 4)["problem"] == "not a signoff result (no groups)"
