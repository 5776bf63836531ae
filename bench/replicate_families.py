"""Weightless exports of transformers decoder types, their layers copied from two traced (softsyn.frontends.replicate)
against every layer traced: op counts, and ORT's outputs (logits and present KV) with the same seeded weights filled
into both, at tiny widths and 4 layers in fp32. One line per type: what the provenance says of its layers, whether
the op counts match, the largest absolute difference of any output. A type whose layers differ is traced whole both
ways (the line says why); one that fails says so.

    python bench/replicate_families.py                       # the default types, ~20 s each on 2 cores
    python bench/replicate_families.py llama phi3 mixtral    # those
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import onnx_ir as ir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from softsyn.frontends import hf, replicate  # noqa: E402 - after the repository root is on the path
from softsyn.frontends.materialize import materialize  # noqa: E402

TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "olmo2", "granite", "cohere", "glm", "starcoder2",
         "stablelm", "phi", "qwen3_moe", "mixtral", "ernie4_5", "smollm3")
LAYERS = 4
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             num_hidden_layers=LAYERS, vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def outputs(nl, cfg, path: Path) -> dict[str, np.ndarray]:
    """ORT CPU's outputs of `nl` with the seeded weights filled in, for 5 new tokens after 3 cached ones."""
    import onnxruntime as ort

    ir.save(materialize(nl.model, cfg), str(path), external_data=path.name + ".data")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 5)),
             "attention_mask": np.ones((2, 8), np.int64), "position_ids": np.tile(np.arange(3, 8), (2, 1))}
    past = np.random.default_rng(1).standard_normal((2, cfg.num_key_value_heads, 3, cfg.head_dim)).astype(np.float32)
    feeds |= {f"past_key_values.{i}.{kv}": past for i in range(LAYERS) for kv in ("key", "value")}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def compare(model_type: str, folder: Path) -> str:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, **SMALL)

    def weightless(sub: str):
        return hf.load_transformers_design(cfg, model_type, "bench", folder / sub, progress=False, weights="meta",
                                           dtype="float32")

    copied = weightless("copied")
    with mock.patch.object(replicate, "homogeneous", lambda cfg: False):  # the plan without copies
        traced = weightless("traced")
    ops = [collections.Counter(n.op_type for n in nl.nodes()) for nl in (copied, traced)]
    got, want = outputs(copied, cfg, folder / "copied.onnx"), outputs(traced, cfg, folder / "traced.onnx")
    diff = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    return (f"{model_type}: {copied.provenance.get('layers', 'every layer traced')}; op counts "
            f"{'equal' if ops[0] == ops[1] else 'DIFFER'}; max |copied - traced| {diff:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", default=list(TYPES), help="transformers model types")
    args = parser.parse_args()
    for model_type in args.types:
        with tempfile.TemporaryDirectory() as folder:
            try:
                line = compare(model_type, Path(folder))
            except Exception as exc:  # noqa: BLE001 - the answer is the failure, one line a type
                line = f"{model_type}: failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
