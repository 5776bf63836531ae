"""Issue 25, "Hostile files": a session.json, a constraints file or a model folder can come from anyone. Each
reported case is refused with one `softsyn: error:` line and exit 2 (never 3, never 0, never a hang or a crash),
and a sentinel folder outside the artifact, which the hostile file points at, is byte for byte as it was."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from softsyn.cli import run
from softsyn.runtime.session import ARTIFACT_OPTIONS, SESSION_OPTIONS, session_options_problem


def cli(capsys, *args) -> tuple[int, str, str]:
    """`softsyn ARGS` in this process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        run([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("softsyn: error: "), err
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (files hashed, links by target, folders by name)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


@pytest.fixture
def sentinel(tmp_path):
    """A folder outside every artifact, with files a hostile artifact names; `check()` asserts it unchanged."""
    folder = tmp_path / "sentinel"
    folder.mkdir()
    (folder / "victim.txt").write_text("the user's file\n")
    (folder / "secret.bin").write_bytes(os.urandom(651))
    before = snapshot(folder)

    class Sentinel:
        path = folder

        @staticmethod
        def check():
            assert snapshot(folder) == before, "a file outside the named folders changed"
    return Sentinel


@pytest.fixture
def artifact(tiny_cpu_artifact, tmp_path):
    """A private copy of the compiled qwen3-tiny artifact (built once per session) to make hostile."""
    out = tmp_path / "art"
    shutil.copytree(tiny_cpu_artifact, out, symlinks=True)
    return out


def edit_session(artifact: Path, **changes) -> Path:
    path = artifact / "runtime" / "session.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "session_options":
            data["session_options"].update(value)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return path


def mlp(path: Path, names=("mm", "relu"), location: str | None = None) -> Path:
    """x[batch, 16] -> MatMul(W) -> Relu -> y; W stored as external data at `location` when given."""
    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "W")
    if location is not None:
        w.data_location = TensorProto.EXTERNAL
        w.ClearField("raw_data")
        entry = w.external_data.add()
        entry.key, entry.value = "location", location
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name=names[0]),
             helper.make_node("Relu", ["h"], ["y"], name=names[1])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


# ------------------------------------------------------------------------------------------ session_options

def test_every_option_softsyn_writes_is_allowed(tiny_cpu_artifact):
    written = json.loads((tiny_cpu_artifact / "runtime" / "session.json").read_text())["session_options"]
    assert set(written) <= set(SESSION_OPTIONS) and set(ARTIFACT_OPTIONS) <= set(SESSION_OPTIONS)
    assert session_options_problem(written) is None and session_options_problem(ARTIFACT_OPTIONS) is None


@pytest.mark.parametrize("command", ["run", "signoff"])
@pytest.mark.parametrize("options, words", [
    ({"optimized_model_filepath": "SENTINEL/victim.txt"}, "session_options.optimized_model_filepath: not an option"),
    ({"enable_profiling": True, "profile_file_prefix": "SENTINEL/prof"}, "session_options.enable_profiling: not an"),
    ({"intra_op_num_threads": 100000}, "session_options.intra_op_num_threads: 100000 is not valid; valid: an integer"
                                       " 0..256"),
    ({"graph_optimization_level": "ORT_ENABLE_EVERYTHING"}, "session_options.graph_optimization_level: "
                                                            "\"ORT_ENABLE_EVERYTHING\" is not valid; valid: one of"),
    ({"intra_op_num_threads": True}, "session_options.intra_op_num_threads: true is not valid"),
], ids=["optimized-model", "profiling", "threads", "level", "bool-threads"])
def test_session_options_outside_the_allow_list_are_refused(artifact, sentinel, capsys, command, options, words):
    options = {k: v.replace("SENTINEL", str(sentinel.path)) if isinstance(v, str) else v for k, v in options.items()}
    path = edit_session(artifact, session_options=options)
    args = ["--gen", 2, "--runs", 1, "--warmup", 0] if command == "run" else ["--runs", 1]
    code, _, err = cli(capsys, command, artifact, "-q", *args)
    line = error_line(err)
    assert code == 2 and f"{path}: {words}" in line, err
    sentinel.check()
    assert not list(sentinel.path.glob("prof*")) and not list(Path.cwd().glob("prof*"))


# ------------------------------------------------------------------------------------------ paths an artifact names

@pytest.mark.parametrize("command", ["run", "verify"])
@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_the_model_an_artifact_names_stays_in_its_folder(artifact, sentinel, capsys, command, how):
    target = sentinel.path / "victim.txt"
    if how == "dotdot":
        edit_session(artifact, model="../../../../../../../../etc/passwd")
        words = '"../../../../../../../../etc/passwd" leads out of'
    elif how == "absolute":
        edit_session(artifact, model=str(target))
        words = f'"{target}" leads out of'
    else:
        (artifact / "model.onnx").unlink()
        (artifact / "model.onnx").symlink_to(target)
        words = f"is a symlink leading out of {artifact} (to {target})"
    code, _, err = cli(capsys, command, artifact, *(["-q", "--gen", 2, "--runs", 1] if command == "run" else []))
    line = error_line(err)
    assert code == 2 and words in line and "root:" not in line, err
    sentinel.check()


@pytest.mark.parametrize("blocks, words", [
    ([{"file": "../vision.onnx"}], 'blocks[0].file: "../vision.onnx" leads out of'),
    ([{"name": "vision"}], "blocks[0].file: null is not a file name"),
    ("vision.onnx", "blocks: not a list of objects"),
], ids=["dotdot", "missing", "not-a-list"])
def test_composite_block_files_stay_in_the_folder(tmp_path, blocks, words):
    from softsyn.errors import SoftsynError
    from softsyn.runtime.artifact import check_session

    path = tmp_path / "art" / "runtime" / "session.json"
    with pytest.raises(SoftsynError) as exc:
        check_session({"model": "model.onnx", "blocks": blocks, "session_options": {}}, path)
    assert str(exc.value).startswith(f"{path}: {words}"), exc.value


def _record_stats(monkeypatch, watched: Path) -> list[str]:
    """Calls of os.stat / open on `watched` from here on (os.lstat, which reads a link itself, is allowed)."""
    calls: list[str] = []
    real_stat, real_open = os.stat, os.open

    def stat(path, *args, **kwargs):
        if os.fspath(path) == str(watched):
            calls.append("stat")
        return real_stat(path, *args, **kwargs)

    def open_(path, *args, **kwargs):
        if os.fspath(path) == str(watched):
            calls.append("open")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "open", open_)
    return calls


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_external_data_outside_the_model_folder_is_refused_untouched(tmp_path, sentinel, capsys, monkeypatch, how):
    folder = tmp_path / "model"
    folder.mkdir()
    secret = sentinel.path / "secret.bin"
    location = {"absolute": str(secret), "dotdot": "../sentinel/secret.bin", "symlink": "weights.bin"}[how]
    if how == "symlink":
        (folder / "weights.bin").symlink_to(secret)
    model = mlp(folder / "m.onnx", location=location)
    calls = _record_stats(monkeypatch, secret)
    code, _, err = cli(capsys, "analyze", model, "-q")
    line = error_line(err)
    assert code == 2 and f"{model}: weight W: external data: \"{location}\"" in line, err
    assert "symlink leading out" in line if how == "symlink" else "leads out of" in line
    assert "bytes" not in line and "truncated" not in line and "path traversal" not in line
    assert calls == [], f"{secret} was touched: {calls}"
    sentinel.check()


def test_run_refuses_a_data_file_linked_out_of_the_artifact(artifact, sentinel, capsys):
    (artifact / "model.onnx.data").unlink()
    (artifact / "model.onnx.data").symlink_to(sentinel.path / "secret.bin")
    code, _, err = cli(capsys, "run", artifact, "-q", "--gen", 2, "--runs", 1)
    line = error_line(err)
    assert code == 2 and "external data: \"model.onnx.data\" is a symlink leading out of" in line, err
    sentinel.check()


@pytest.mark.parametrize("command", ["run", "signoff"])
def test_a_cut_data_file_is_refused_before_onnx_runtime_reads_it(artifact, capsys, command):
    data = artifact / "model.onnx.data"
    with open(data, "r+b") as fh:
        fh.truncate(651)
    code, _, err = cli(capsys, command, artifact, "-q", "--runs", 1)
    line = error_line(err)
    assert code == 2 and f"its external data file {data} is truncated (651 bytes, the tensor ends at byte" in line, err


# ------------------------------------------------------------------------------------------ files that never end

@pytest.fixture
def deadline():
    """Fail instead of hanging (a FIFO with no writer blocked forever)."""
    def expired(*_):
        raise TimeoutError("softsyn blocked on a file")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "huge"])
def test_constraints_must_be_a_regular_file_of_bounded_size(tmp_path, sentinel, capsys, deadline, kind):
    if kind == "dev-zero":
        path, words = Path("/dev/zero"), "/dev/zero: not a regular file (a character device); expected a constraints"
    elif kind == "fifo":
        path = tmp_path / "c.yaml"
        os.mkfifo(path)
        words = f"{path}: not a regular file (a FIFO); expected a constraints file"
    else:
        path = tmp_path / "c.yaml"
        with open(path, "wb") as fh:
            fh.truncate(17 * 2**20)  # sparse: the size is what counts
        words = f"{path}: {17 * 2**20} bytes; a constraints file is at most {16 * 2**20} bytes"
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "-q", "-c", path)
    assert code == 2 and words in error_line(err), err
    sentinel.check()


@pytest.mark.parametrize("which", ["session", "config", "annotation"])
def test_other_files_softsyn_reads_back_are_regular_files(artifact, tmp_path, capsys, deadline, which):
    if which == "session":
        path = artifact / "runtime" / "session.json"
        path.unlink()
        args = ["run", artifact, "-q"]
    elif which == "config":
        (tmp_path / "hf").mkdir()
        path = tmp_path / "hf" / "config.json"
        args = ["analyze", path, "-q"]
    else:
        path = tmp_path / "annotation.json"
        args = ["analyze", mlp(tmp_path / "m.onnx"), "-q", "--annotate", path]
    os.mkfifo(path)
    code, _, err = cli(capsys, *args)
    words = "not an .onnx file, a config.json or a model folder" if which == "config" else \
        f"{path}: not a regular file (a FIFO)"
    assert code == 2 and words in error_line(err), err


def test_a_kv_length_that_is_no_integer_is_refused(artifact, capsys):
    path = edit_session(artifact, kv_cache={"ports": [], "max_length": "1e12"})
    code, _, err = cli(capsys, "run", artifact, "-q")
    assert code == 2 and f'{path}: kv_cache.max_length: "1e12" is not valid; valid: an integer 1..' in error_line(err)


# ------------------------------------------------------------------------------------------ arguments and constraints

def test_a_huge_prompt_is_refused_before_it_is_drawn(artifact, capsys, monkeypatch):
    import softsyn.flow.run as flow_run

    def never(*_):
        raise AssertionError("the prompt was allocated before its size was checked")
    monkeypatch.setattr(flow_run, "prompt_ids", never)
    code, _, err = cli(capsys, "run", artifact, "-q", "--prompt-len", 1000000000)
    line = error_line(err)
    assert code == 2 and "prompt 1000000000 + 32 generated tokens need 1000000031 positions; the artifact holds 512 " \
                         "(its KV buffer); valid: prompt + gen - 1 <= 512" in line, err


@pytest.mark.parametrize("command", ["run", "verify"])
def test_a_negative_seed_is_bad_input(artifact, capsys, command):
    code, _, err = cli(capsys, command, artifact, "--seed", -1)
    assert code == 2 and "Invalid value for '--seed': -1 is not in the range 0<=x<=4294967295" in error_line(err), err


def test_verify_refuses_another_model_in_place(artifact, sentinel, capsys):
    mlp(artifact / "model.onnx")
    (artifact / "model.onnx.data").unlink()
    code, _, err = cli(capsys, "verify", artifact)
    line = error_line(err)
    assert code == 2 and f"{artifact / 'model.onnx'}: inputs x are not the reference's (input_ids," in line, err
    assert "not the model softsyn compiled there" in line
    sentinel.check()


def test_characterize_cells_matching_nothing_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    import softsyn.characterize.plan as plan  # the name plan calls (the lazy CLI may import plan first right here)

    monkeypatch.setattr(plan, "measure_ceilings", lambda *a, **k: pytest.fail("measured before the check"))
    out = tmp_path / "lib.yaml"
    code, _, err = cli(capsys, "characterize", "--cells", "MatMul*,NoSuchOp", "-o", out, "-q")
    line = error_line(err)
    assert code == 2 and "characterize --cells 'MatMul*,NoSuchOp': NoSuchOp names no cell on --provider cpu" in line
    assert not out.exists()


@pytest.mark.parametrize("text, words", [
    ("~\n", "c.yaml:1: the document is null (~); expected a mapping"),
    ("", "c.yaml:1: empty constraints file; expected a mapping"),
    ("dont_touch: ['[']\n", "c.yaml:1: dont_touch[0]: '[' is not a hierarchy glob: '[' at 0 is never closed"),
    ("dont_touch:\n  - lm_head\n  - model.layers.[0-\n",
     "c.yaml:3: dont_touch[1]: 'model.layers.[0-' is not a hierarchy glob: '[' at 13 is never closed"),
    ("dont_touch: \"lm head\"\n", "c.yaml:1: dont_touch: 'lm head' is not a hierarchy glob: character ' '"),
    ("dont_touch: [\"a\\x1b[31m\"]\n", "dont_touch[0]: 'a\\x1b[31m' is not a hierarchy glob: character '\\x1b'"),
], ids=["tilde", "empty", "open-bracket", "open-range", "blank", "escape"])
def test_constraints_that_passed_are_refused(tmp_path, capsys, text, words):
    (tmp_path / "c.yaml").write_text(text)
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx"), "-q", "-c", tmp_path / "c.yaml")
    assert code == 2 and words in error_line(err), err


@pytest.mark.parametrize("dims, words", [
    ("{batch: 0, seq: 0}", "c.yaml:4: path_groups.prefill.dims.batch: must be an integer >= 1, got 0"),
    ("{batch: 1, seq: 0}", "c.yaml:4: path_groups.prefill.dims.seq: must be an integer >= 1, got 0"),
], ids=["batch-0", "seq-0"])
def test_a_dim_of_zero_is_refused(tmp_path, capsys, cache_dir, dims, words):
    (tmp_path / "c.yaml").write_text(f"clock_period: 20ms\npath_groups:\n  prefill:\n    dims: {dims}\n")
    code, _, err = cli(capsys, "analyze", "zoo:qwen3-tiny", "--cache-dir", cache_dir, "-q", "-c", tmp_path / "c.yaml")
    assert code == 2 and words in error_line(err), err


def test_past_may_be_zero_and_globs_that_are_globs_pass(tmp_path, capsys, cache_dir):
    (tmp_path / "c.yaml").write_text("clock_period: 20ms\ndont_touch: [lm_head, 'model.layers.[0-3].*', '[!a]*']\n"
                                     "path_groups:\n  prefill:\n    dims: {batch: 1, seq: 16, past: 0}\n")
    code, _, err = cli(capsys, "analyze", "zoo:qwen3-tiny", "--cache-dir", cache_dir, "-q", "-c", tmp_path / "c.yaml")
    assert code in (0, 1), err


# ------------------------------------------------------------------------------------------ names in text reports

EVIL = ("mm\nFORGED ROW 0.000 (MET)", "relu\x1b[31mred\u202eevil")


def test_node_names_print_escaped_in_text_reports(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = cli(capsys, "analyze", mlp(tmp_path / "m.onnx", names=EVIL), "-q", "-o", out)
    assert code in (0, 1), err
    full = (out / "reports" / "timing_full.rpt").read_text()
    assert "  mm\\nFORGED ROW 0.000 (MET)" in full and "relu\\x1b[31mred\\u202eevil" in full
    for path in (out / "reports").glob("*.rpt"):
        text = path.read_text()
        assert not any(c in text for c in "\x1b\u202e\r"), path
        assert not any(line.startswith("FORGED") for line in text.splitlines()), path


def test_fusion_report_escapes_sites_and_reasons():
    from passes.fuse.base import Coverage, Miss
    from reports.fusion import report_fusion

    text = report_fusion([Coverage("gelu", 1, 0, [Miss(EVIL[0], "check failed at " + EVIL[1])])], design=EVIL[1])
    assert "[gelu] mm\\nFORGED ROW 0.000 (MET)" in text and "reason: check failed at relu\\x1b[31mred\\u202eevil" in text
    assert "Design : relu\\x1b[31mred\\u202eevil" in text
    assert not any(c in text for c in "\x1b\u202e") and "\nFORGED" not in text


# ------------------------------------------------------------------------------------------ a full disk

@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                   OSError("problem writing element 'model.layers.0.mlp.down_proj.weight'")],
                         ids=["enospc", "no-errno"])
def test_a_full_disk_while_writing_the_export_cache(tmp_path, sentinel, capsys, monkeypatch, error):

    import softsyn.frontends.cache as cache

    def full(model, path, *args, **kwargs):
        Path(path).write_bytes(b"\0" * 100)
        raise error
    monkeypatch.setattr(cache.ir, "save", full)
    fresh = tmp_path / "cache"
    code, _, err = cli(capsys, "analyze", "zoo:qwen3-tiny", "--cache-dir", fresh)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and lines[-1].startswith(f"softsyn: error: {fresh}/qwen3-tiny-"), err
    assert "cannot write the export cache entry: " + (error.strerror or str(error)) in lines[-1]
    assert "internal error" not in err and sum("softsyn: error:" in line for line in lines) == 1, err
    # the entry's lock file stays (deleting a lock file another process may hold is a race); no entry, no temporary
    assert [p.name for p in fresh.iterdir() if not p.name.endswith(".lock")] == [], "a half-written cache entry stayed"
    sentinel.check()
