"""Fault injection (issue 12): SIGKILL of `softsyn compile` / `softsyn analyze` at seeded random points of their
last phase, a full disk, a read-only target. After each: DIR is the previous complete output or the new
complete one (every file as its manifest says, nothing else but the user's), never a mix; the next
successful run leaves no leftovers.

The children read qwen3-tiny's export from the warm session cache as its model.onnx file, so each skips
importing torch (it is the same netlist zoo:qwen3-tiny gives); the kills land after the child's last
progress line before it writes, at random points of 1.3x the time from that line to DIR being in place in
a calibration run (the first run, which makes the previous output): most land while the staging folder
is written, some after the swap.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from softsyn import outdir
from softsyn.cli import run
from softsyn.frontends import read_design
from softsyn.runtime.measure import onnx_path

SEED = 12
KILLS = 3  # kill points per command
CONSTRAINTS = "clock_period: {clock}\nworkload: {{batch: 1, prompt_len: 16, context_len: 32}}\n"
# the last progress line each command prints before it writes DIR
TRIGGER = {"compile": "pass precision:", "analyze": "timed decode"}


@pytest.fixture(scope="module")
def model(cache_dir):
    return onnx_path(read_design("zoo:qwen3-tiny", cache_dir=cache_dir, progress=False))


@pytest.fixture
def constraints(tmp_path):
    files = {}
    for name, clock in (("old", "10s"), ("new", "20s")):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(CONSTRAINTS.format(clock=clock))
    return files


def softsyn(*args, kill_after: float | None = None, trigger: str = "") -> tuple[int, float | None]:
    """Run the CLI in a child; SIGKILL it `kill_after` s after its stderr shows `trigger`. Returns (exit
    status, seconds from the trigger line to the first "[softsyn] wrote" line, printed once DIR is in place)."""
    child = subprocess.Popen([sys.executable, "-m", "softsyn.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seen = phase = None
    for line in child.stderr:
        if seen is None and trigger and trigger in line:
            seen = time.perf_counter()
            if kill_after is not None:
                time.sleep(kill_after)
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGKILL)
                break
        if seen is not None and phase is None and "[softsyn] wrote" in line:
            phase = time.perf_counter() - seen
    code = child.wait()
    child.stderr.close()
    return code, phase


def assert_complete(out: Path, expected_constraints: set[str], user: dict[str, str]) -> str:
    """DIR is one complete output: every listed file as the manifest says, nothing unlisted but the user's."""
    manifest = json.loads((out / outdir.MANIFEST).read_text())
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert files == set(manifest["files"]) | {outdir.MANIFEST} | set(user), files ^ set(manifest["files"])
    for rel, record in manifest["files"].items():
        assert (out / rel).stat().st_size == record["size"] and outdir.sha256(out / rel) == record["sha256"], rel
    for rel, text in user.items():
        assert (out / rel).read_text() == text
    made_with = json.loads((out / "analysis.json").read_text())["constraints_file"]
    assert made_with in expected_constraints
    return made_with


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.softsyn-"))


@pytest.mark.parametrize("command", ["compile", "analyze"])
def test_sigkill_leaves_the_old_or_the_new_output(command, model, constraints, tmp_path, capsys):
    out = tmp_path / "out"
    old, new = str(constraints["old"]), str(constraints["new"])
    code, phase = softsyn(command, model, "-c", old, "-o", out, trigger=TRIGGER[command])
    assert code == 0 and phase is not None
    (out / "notes.txt").write_text("the user's")
    user = {"notes.txt": "the user's"}
    rng = random.Random(f"{SEED}-{command}")
    states = []
    for _ in range(KILLS):
        code, _ = softsyn(command, model, "-c", new, "-o", out, kill_after=rng.uniform(0.0, phase * 1.3),
                          trigger=TRIGGER[command])
        assert code in (0, -signal.SIGKILL)
        states.append((code, Path(assert_complete(out, {old, new}, user)).stem, leftovers(out)))
    code, _ = cli(capsys, command, model, "-c", new, "-o", out, "-q")  # the next run: in this process (no kill)
    assert code == 0 and assert_complete(out, {new}, user) == new
    assert leftovers(out) == [], states


@contextlib.contextmanager
def tmpfs(where: Path, size: str):
    """A tiny tmpfs at `where` (root with mount(2) only); None where it cannot be mounted."""
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def cli(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        run([str(a) for a in args])
    return exc.value.code, capsys.readouterr().err


def test_a_full_disk_leaves_the_previous_output(model, constraints, tmp_path, capsys, monkeypatch):
    with tmpfs(tmp_path / "disk", "2m") as disk:  # the analyze output (~1 MB with report.html) fits, the compiled model not
        out = (disk or tmp_path) / "out"
        assert cli(capsys, "analyze", model, "-c", constraints["old"], "-q", "-o", out)[0] == 0
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        if disk is None:  # no tmpfs: the model write runs out of space half-way
            import onnx_ir

            real = onnx_ir.save

            def full(model_, path, *args, **kwargs):
                real(model_, path, *args, **kwargs)
                Path(path).write_bytes(Path(path).read_bytes()[:100])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

            monkeypatch.setattr(onnx_ir, "save", full)
        code, err = cli(capsys, "compile", model, "-c", constraints["new"], "-q", "-o", out)
        assert code == 2 and "No space left on device" in err and len(err.splitlines()) == 1, err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
        assert leftovers(out) == []


def test_a_read_only_target_is_refused_before_any_work(model, constraints, tmp_path, capsys):
    with tmpfs(tmp_path / "ro", "2m") as disk:
        if disk is None and os.geteuid() == 0:
            pytest.skip("root without mount(2): permissions do not stop root")
        target = disk or tmp_path / "ro"
        out = target / "out"
        assert cli(capsys, "analyze", model, "-c", constraints["old"], "-q", "-o", out)[0] == 0
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        if disk is not None:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        else:
            target.chmod(0o555)
        for command, where in (("compile", out), ("analyze", out), ("analyze", target / "new")):
            code, err = cli(capsys, command, model, "-q", "-o", where)
            assert code == 2 and f"{where}: cannot write there" in err and len(err.splitlines()) == 1, err
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
        if disk is None:
            target.chmod(0o755)  # so pytest can remove it

