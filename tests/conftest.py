"""Shared fixtures: one export cache per test session, so each zoo model is exported once; the CPU artifact of
qwen3-tiny, compiled once per test run for the tests that run it (softsyn run, onnxruntime-genai)."""
import fcntl
import gc
import os
import shutil
from pathlib import Path

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


@pytest.fixture(scope="module", autouse=True)
def frozen_heap():
    """What is alive when a test module starts is left out of garbage collection until it ends (gc.freeze): a worker's
    heap holds every earlier module's imports and fixtures (torch, transformers, exported models), and each
    gc.collect() the code under test makes to free its ORT sessions (characterize per grid point, verify, the
    optimizer's per-cell measurements) would walk all of it (docs/decisions/2026-12-03-test-suite-time.md).
    Everything the module makes is collected as usual; what died before it is collected once, here."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One export cache for the run: under pytest-xdist the workers share it (softsyn.frontends.cache.exporting makes
    a worker wait for a model the other is exporting, then read it), so each model is exported once a run."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "softsyn-cache"
    path.mkdir(exist_ok=True)
    os.environ["SOFTSYN_CACHE"] = str(path)
    return path


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A folder `build(DIR)` makes, built once per test run: under pytest-xdist the first worker to ask builds it in the
    run's folder above the workers' own (a lock makes the others wait for it rather than build it again) and each
    worker takes a copy of its own, so no two workers' tests ever touch one folder. Tests only read it (one that
    changes it works on a copy of its own)."""
    out = tmp_path_factory.mktemp(name) / "out"
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        build(out)
        return out
    shared = tmp_path_factory.getbasetemp().parent / f"built-once-{name}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the build fails
        if not (shared / "complete").exists():
            shutil.rmtree(shared, ignore_errors=True)  # a build that failed half way in another worker
            build(shared / "out")
            (shared / "complete").touch()
    shutil.copytree(shared / "out", out, symlinks=True)
    return out


def compile_in_process(out, *args) -> None:
    """`softsyn compile ARGS -o OUT -q` in this process; the test fails with its output if it does not exit 0."""
    from click.testing import CliRunner

    from softsyn.cli import main

    result = CliRunner().invoke(main, ["compile", *map(str, args), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output + repr(result.exception)


@pytest.fixture(scope="session")
def tiny_cpu_artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:qwen3-tiny -c constraints/cpu-tiny.yaml --effort low -o DIR`: DIR."""
    return built_once(tmp_path_factory, "tiny-cpu", lambda out: compile_in_process(
        out, "zoo:qwen3-tiny", "-c", ROOT / "constraints" / "cpu-tiny.yaml", "--effort", "low",
        "--cache-dir", cache_dir))


@pytest.fixture(scope="session")
def tiny_torch_artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:qwen3-tiny -c constraints/cpu-torch-tiny.yaml -o DIR` (model.pt2): DIR, compiled once."""
    return built_once(tmp_path_factory, "tiny-torch", lambda out: compile_in_process(
        out, "zoo:qwen3-tiny", "-c", ROOT / "constraints" / "cpu-torch-tiny.yaml", "--cache-dir", cache_dir))


@pytest.fixture(scope="session")
def tiny_serving_artifact(cache_dir, tmp_path_factory):
    """`softsyn compile zoo:qwen3-tiny -c constraints/serving-tiny.yaml --effort low -o DIR`: DIR."""
    return built_once(tmp_path_factory, "tiny-serving", lambda out: compile_in_process(
        out, "zoo:qwen3-tiny", "-c", ROOT / "constraints" / "serving-tiny.yaml", "--effort", "low",
        "--cache-dir", cache_dir))
