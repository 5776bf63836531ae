"""The export cache shared by processes (softsyn.frontends.cache): a second process asking for an entry another is
exporting waits for it and reads it; an entry written meanwhile without the lock is kept, not replaced; a cache
folder that cannot be written still reads."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import onnx_ir as ir

from softsyn.frontends import cache
from softsyn.netlist import Netlist

from paths import ROOT


def _netlist(name: str = "y") -> Netlist:
    x = ir.Value(name="x", shape=ir.Shape([1, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    relu = ir.node("Relu", [x])
    relu.outputs[0].name = name
    graph = ir.Graph([x], [relu.outputs[0]], nodes=[relu], opset_imports={"": 18}, name="g")
    return Netlist(ir.Model(graph, ir_version=10), name="g")


def test_a_second_exporter_of_one_entry_waits_for_the_first(tmp_path):
    entry = cache.entry_dir(tmp_path, "model", "0123456789abcdef0")
    events = []

    def second():
        with cache.exporting(entry):
            events.append("second in")

    with cache.exporting(entry):
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.3)
        events.append("first out")
    thread.join(5)
    assert events == ["first out", "second in"]
    other = cache.entry_dir(tmp_path, "other", "0123456789abcdef0")
    with cache.exporting(entry), cache.exporting(other):  # entries lock apart
        pass


def test_an_entry_written_meanwhile_is_kept_and_returned(tmp_path):
    entry = cache.entry_dir(tmp_path, "model", "0123456789abcdef0")
    first = cache.save_entry(_netlist("first"), entry)
    again = cache.save_entry(_netlist("second"), entry)  # same key: another process's export of the same content
    assert [v.name for v in again.model.graph.outputs] == ["first"] == [v.name for v in first.model.graph.outputs]
    assert sorted(p.name for p in tmp_path.iterdir()) == [entry.name]  # no temporary folder left
    (entry / cache.MODEL_FILE).write_text("damaged")
    replaced = cache.save_entry(_netlist("third"), entry)  # an unreadable entry is replaced
    assert [v.name for v in replaced.model.graph.outputs] == ["third"]


def test_a_cache_without_room_for_the_lock_still_reads(tmp_path, monkeypatch):
    entry = cache.entry_dir(tmp_path, "model", "0123456789abcdef0")
    cache.save_entry(_netlist(), entry)

    def refused(path, *args):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cache.os, "open", refused)  # a read-only cache folder (root ignores chmod: refuse here)
    with cache.exporting(entry):
        assert cache.load_entry(entry) is not None


TWO_READS = r"""
import json, sys
from softsyn.frontends import read_design
nl = read_design("zoo:qwen3-tiny", cache_dir=sys.argv[1], progress=False)
print(json.dumps(nl.provenance["cache"]["hit"]))
"""


def test_two_processes_reading_one_model_export_it_once(tmp_path):
    """Two softsyn processes read zoo:qwen3-tiny into one empty cache at once: one exports, the other waits and
    reads the entry (before the lock both exported, and the later one's rename could delete the entry under the
    earlier one's lazy reads)."""
    runs = [subprocess.Popen([sys.executable, "-c", TWO_READS, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-1000:] for _, err in outs]
    assert sorted(out.strip().splitlines()[-1] for out, _ in outs) == ["false", "true"]
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 1
