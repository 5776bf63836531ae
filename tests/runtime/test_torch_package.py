"""The README's loader: a fresh Python process loads DIR/model.pt2 with torch alone (softsyn never imported) and
gets the decode step's logits the package gives softsyn's runner."""
import re
import subprocess
import sys

import numpy as np

from paths import ROOT
from softsyn.runtime.torch_package import TorchStep, read_torch_settings


def _readme_loader() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    return next(b for b in blocks if "aoti_load_package" in b)


def test_readme_loader_in_a_fresh_process(tiny_torch_artifact, tmp_path):
    saved = tmp_path / "logits.npy"
    code = (_readme_loader().replace('"out/torch/', f'"{tiny_torch_artifact}/')
            + f"import numpy, sys\nassert 'softsyn' not in sys.modules\nnumpy.save({str(saved)!r}, logits.numpy())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^next token: \d+$", done.stdout, re.M)
    step = TorchStep(tiny_torch_artifact, read_torch_settings(tiny_torch_artifact))
    cache = step.empty_cache()
    token = int(step(np.array([[1, 2, 3]]), 0, cache)[0, -1].argmax())
    logits = step(np.array([[token]]), 3, cache)
    np.testing.assert_allclose(np.load(saved), logits.numpy(), rtol=1e-5, atol=1e-5)  # spans of 4 vs 256 slots


def test_step_inputs_hold_ids_then_positions_at_an_aligned_offset():
    # one flat array (one copy to the device): ids, then positions from INPUT_ALIGN, each a contiguous [B, seq] view
    import torch

    from softsyn.runtime.torch_package import INPUT_ALIGN, input_slots, input_views, step_inputs

    ids = np.arange(6, dtype=np.int64).reshape(2, 3) + 100
    flat = step_inputs(ids, 40)
    n, pad = input_slots(ids.shape)
    assert (n, pad) == (6, INPUT_ALIGN) and flat.shape == (2 * INPUT_ALIGN,)
    tokens, positions = input_views(torch.from_numpy(flat), ids.shape)
    assert tokens.is_contiguous() and positions.is_contiguous()
    assert positions.storage_offset() * 8 % 64 == 0
    np.testing.assert_array_equal(tokens.numpy(), ids)
    np.testing.assert_array_equal(positions.numpy(), [[40, 41, 42], [40, 41, 42]])
    again = step_inputs(np.array([[7]]), 9, flat)  # into a staging array of a larger shape: its first slots only
    assert again is flat and [int(v) for v in input_views(torch.from_numpy(again), (1, 1))] == [7, 9]
