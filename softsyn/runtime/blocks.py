"""A composite's blocks run in order, one ONNX Runtime session each, as onnxruntime-genai runs a multimodal model:
vision (when the prompt has images), then the embedding, then the decoder; each block's outputs feed the next
blocks' inputs by name. The runner answers like one session (get_inputs, get_outputs, run, get_providers)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from softsyn.runtime.session import SessionSettings, open_session


class BlockRunner:
    def __init__(self, folder: Path, blocks: list[dict], settings: SessionSettings):
        self.blocks = blocks
        self.sessions = {b["name"]: open_session(Path(folder) / b["file"], settings) for b in blocks}
        produced = {o for b in blocks for o in b["outputs"]}
        self._inputs = [i for b in blocks for i in self.sessions[b["name"]].get_inputs() if i.name not in produced]
        self._outputs = self.sessions[blocks[-1]["name"]].get_outputs()

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self._outputs

    def get_providers(self):
        return self.sessions[self.blocks[-1]["name"]].get_providers()

    def values(self, feeds: dict, names: list[str] | None = None) -> dict:
        """The feeds and every block's outputs: the blocks `names` run (default: every block the feeds call for, the
        vision block only when they hold pixels), the others' outputs empty (a text-only prompt or a decode step: no
        image features)."""
        values = dict(feeds)
        for b in self.blocks:
            session = self.sessions[b["name"]]
            wanted = b["name"] in names if names is not None else (
                b["name"] != "vision" or _has_rows(values.get("pixel_values")))
            if not wanted:
                values.update(_empty_outputs(session))
                continue
            outs = session.run(None, {i: values[i] for i in b["inputs"]})
            values.update(zip(b["outputs"], outs))
        return values

    def run(self, names, feeds: dict) -> list:
        values = self.values(feeds)
        last = self.blocks[-1]["outputs"]
        return [values[n] for n in (names or last)]


def _has_rows(value) -> bool:
    return value is not None and value.shape[0] > 0


def _empty_outputs(session) -> dict:
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    return {o.name: np.zeros([d if isinstance(d, int) else 0 for d in o.shape], dtype=types.get(o.type, np.float32))
            for o in session.get_outputs()}
