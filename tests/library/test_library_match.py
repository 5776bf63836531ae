"""The library for this machine (softsyn.library.match): a library's device against the host's at analyze, the
closest shipped library picked when none is named, and the mismatch said in one line and in every banner."""

from click.testing import CliRunner

from paths import ROOT
from softsyn.cli import main
from softsyn.library.match import HOST_ENV, pick_cpu_library, same_device, shipped_headers

EPYC = shipped_headers()["cpu-ort"][1]
XEON = shipped_headers()["cpu-ort-xeon"][1]
LAPTOP = "Intel(R) Core(TM) i7-1185G7 @ 3.00GHz, 8 cores (avx2, fma, f16c, avx512f, avx512_vnni)"


def test_same_device_reads_name_cores_and_isa():
    assert same_device(XEON, XEON.replace(" @ 2.80GHz", ""))  # the clock is the hypervisor's whim
    assert not same_device(XEON, XEON.replace("2 cores", "4 cores"))
    assert not same_device(XEON, XEON.replace("avx512_vnni)", "avx512_vnni, amx_int8)"))  # another generation
    assert not same_device(EPYC, XEON)


def test_pick_names_the_match_or_the_closest():
    assert pick_cpu_library(EPYC).library == "cpu-ort" and not pick_cpu_library(EPYC).mismatch
    assert pick_cpu_library(XEON).library == "cpu-ort-xeon" and not pick_cpu_library(XEON).mismatch
    closest = pick_cpu_library(LAPTOP)  # Intel, like the Xeon library's machine: the closest, said to differ
    assert closest.library == "cpu-ort-xeon"
    assert closest.mismatch.startswith("no shipped library describes this machine; using the closest, library "
                                       "cpu-ort-xeon was characterised on Intel(R) Xeon(R)")
    assert "softsyn characterize --provider cpu --quick" in closest.mismatch


def analyze(monkeypatch, host: str, *args: str):
    monkeypatch.setenv(HOST_ENV, host)
    return CliRunner().invoke(main, ["analyze", "zoo:qwen3-tiny", *args])


def test_analyze_on_another_machine_names_the_mismatch(monkeypatch, cache_dir):
    result = analyze(monkeypatch, LAPTOP, "-c", str(ROOT / "constraints" / "cpu-tiny.yaml"))  # target: cpu-ort
    assert result.exit_code in (0, 1), result.output
    lines = [line for line in result.stderr.splitlines() if "describe" in line]
    assert lines == [f"[softsyn] warning: library cpu-ort was characterised on {EPYC}; this machine is {LAPTOP}: its "
                     "timings describe that machine, not this one; characterise this machine (minutes): softsyn "
                     "characterize --provider cpu --quick -o my-cpu.yaml, then --target my-cpu.yaml"]
    header = result.stdout.split("Report : qor")[0]  # report_timing's banner
    assert "Library: cpu-ort (" in header
    assert f"Warning: timings describe another machine: library cpu-ort was characterised on {EPYC}" in header


def test_analyze_without_target_picks_this_machines_library(monkeypatch, cache_dir):
    result = analyze(monkeypatch, XEON, "-c", str(ROOT / "constraints" / "guide-short.yaml"))  # names no target
    assert result.exit_code in (0, 1), result.output
    assert f"[softsyn] library cpu-ort-xeon: characterised on this machine's device ({XEON})" in result.stderr
    assert "Library: cpu-ort-xeon (" in result.stdout and "another machine" not in result.stdout


def test_analyze_on_the_librarys_machine_says_nothing(monkeypatch, cache_dir):
    result = analyze(monkeypatch, EPYC, "-c", str(ROOT / "constraints" / "cpu-tiny.yaml"))
    assert result.exit_code in (0, 1), result.output
    assert "describe" not in result.stderr and "another machine" not in result.stdout
