"""Greedy tokens of a compiled artifact under onnxruntime-genai (its Model, GeneratorParams, Generator)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def genai_tokens(artifact: Path, prompt: np.ndarray, n: int) -> list[int]:
    """`n` tokens genai generates after `prompt` from DIR's genai_config.json (greedy: the config's defaults)."""
    import onnxruntime_genai as og

    model = og.Model(str(artifact))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + n)  # prompt + generated tokens
    generator = og.Generator(model, params)
    generator.append_tokens(prompt.astype(np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens
