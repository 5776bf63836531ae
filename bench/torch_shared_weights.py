"""Whether a torch target's two packages share one set of weights on the device (issue 28): device memory in use
before and after softsyn's runner loads DIR (model.pt2 and model-prefill.pt2), beside the weights' size.

    python bench/torch_shared_weights.py DIR

Prints one line: `shared weights: yes|NO|no, by design ...` ("no, by design": the prefill package is built
with weights of its own, as the target's prefill_weights "resident" builds it: its int4/fp8 layers held
dequantised). Device memory is cudaMemGetInfo's used bytes (the AOTInductor runtime allocates constants with
cudaMalloc, which torch.cuda.memory_allocated does not count; both are printed); the weights' size is model.pt2's
blob (or, where model.pt2 holds its weights inside its .so, the file's size). "yes" when loading both took less than
1.5 times the weights.
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import torch

from softsyn.runtime.torch_package import PREFILL, TorchStep, read_torch_settings
from softsyn.runtime.torch_weights import BLOB_SUFFIX, OWN


def weight_bytes(package: Path) -> tuple[int, str]:
    with zipfile.ZipFile(package) as archive:
        blobs = [i.file_size for i in archive.infolist() if i.filename.endswith(BLOB_SUFFIX)]
    return (blobs[0], "model.pt2's blob") if blobs else (package.stat().st_size, "model.pt2's size (no blob)")


def used() -> int:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


def main(directory: str) -> None:
    out = Path(directory)
    settings = read_torch_settings(out)
    size, what = weight_bytes(out / settings["package"])
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context first: its memory is not the packages'
    before, allocated = used(), torch.cuda.memory_allocated()
    step = TorchStep(out, settings)
    grew, grew_allocated = used() - before, torch.cuda.memory_allocated() - allocated
    shared = step.shared is not None and grew < 1.5 * size
    own = PREFILL in step.packages and step.packages[PREFILL].get("constants", OWN) == OWN
    verdict = "yes" if shared else "no, by design" if own else "NO"
    print(f"shared weights: {verdict}: loading {', '.join(p.name for p in step.paths.values())} took "
          f"{grew / 1e9:.3f} GB of device memory (cudaMemGetInfo; memory_allocated {grew_allocated / 1e9:.3f} GB); "
          f"the weights {size / 1e9:.3f} GB ({what}): {grew / size:.2f} times; torch {torch.__version__}; "
          f"runner: {step.weights}")


if __name__ == "__main__":
    main(sys.argv[1])
