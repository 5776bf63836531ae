"""Shared fixtures: one export cache per test session, so each zoo model is exported once; the CPU artifact of
qwen3-tiny, compiled once per session for the tests that run it (softsyn run, onnxruntime-genai)."""
import os

import pytest

# The command line imports its command bodies lazily (softsyn.cli.app.COMMANDS); load them here, once, so a body's
# `from module import name` never binds a test's monkeypatched stand-in when that test is the first to run a command.
import softsyn.cli.design_run  # noqa: F401,E402
import softsyn.cli.tools_run  # noqa: F401,E402

from paths import ROOT


os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests run as on the machine the default library (cpu-ort) describes, whatever CPU runs them: which shipped library a
# run without a target picks, and whether reports carry a library-mismatch warning, must not depend on the host.
os.environ.setdefault("SOFTSYN_HOST_DEVICE", "AMD EPYC, 2 cores (avx2, fma, f16c, avx512f, avx512_bf16, avx512_vnni, avx_vnni)")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("softsyn-cache")
    os.environ["SOFTSYN_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_cpu_artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:qwen3-tiny -c constraints/cpu-tiny.yaml --effort low -o DIR`: DIR."""
    from click.testing import CliRunner

    from softsyn.cli import main

    out = tmp_path_factory.mktemp("tiny-cpu") / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-tiny", "-c", str(ROOT / "constraints" / "cpu-tiny.yaml"),
                                       "--effort", "low", "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out


@pytest.fixture(scope="session")
def tiny_torch_artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:qwen3-tiny -c constraints/cpu-torch-tiny.yaml -o DIR` (model.pt2): DIR, compiled once."""
    from click.testing import CliRunner

    from softsyn.cli import main

    out = tmp_path_factory.mktemp("tiny-torch") / "out"
    result = CliRunner().invoke(main, ["compile", "zoo:qwen3-tiny", "-c", str(ROOT / "constraints" / "cpu-torch-tiny.yaml"),
                                       "-o", str(out), "--cache-dir", str(cache_dir), "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return out
