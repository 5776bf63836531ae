"""Whether AOTInductor packages softsyn's prompt attention form (softsyn.emit.torch_step.prompt_attention: flash
attention's causal form over a span that ends at the step's last position, no mask, query heads grouped in the kernel)
with batch, positions and span dynamic, and whether it computes the sdpa form's function at a first prompt and at a
continuation (past > 0), then times both forms packaged at prefill 512. Part `prompt` of bench/torch_kernels.py; its
lines printed as they come, so a call cut short still says. Unmeasured on a GPU until those lines come back
(2026-12-07)."""
from __future__ import annotations

import tempfile

import torch

HEADS, KV_HEADS, HEAD_DIM, CACHE = 16, 8, 128, 4160  # qwen3-1.7b's attention, its kv_cache.max_length


class Attend(torch.nn.Module):
    """One attention form as a step calls it: q [B, H, S, D] (transposed from [B, S, H, D]), the cache's first
    `span` slots (span = slots' length), the step's mask."""

    def __init__(self, form: str):
        super().__init__()
        from softsyn.emit.torch_step import ATTENTIONS

        self.function = ATTENTIONS[form][1]

    def forward(self, q, keys, values, positions, slots):
        span = slots.shape[0]
        mask = (slots[None, None, :] <= positions[:, :, None])[:, None]
        return self.function(None, q.transpose(1, 2), keys[:, :, :span], values[:, :, :span], mask,
                             HEAD_DIM ** -0.5)[0]


def inputs(device: str, dtype, batch: int, seq: int, past: int) -> tuple:
    g = torch.Generator(device=device).manual_seed(seq + past)
    cache = [torch.randn(batch, KV_HEADS, CACHE, HEAD_DIM, generator=g, device=device, dtype=dtype) for _ in range(2)]
    positions = torch.arange(past, past + seq, device=device).expand(batch, seq).contiguous()
    return (torch.randn(batch, seq, HEADS, HEAD_DIM, generator=g, device=device, dtype=dtype), *cache, positions,
            torch.arange(past + seq, device=device))


def packaged(form: str, device: str, dtype, folder: str):
    auto = torch.export.Dim.AUTO
    dims = ({0: auto, 1: auto}, {0: auto}, {0: auto}, {0: auto, 1: auto}, {0: auto})
    program = torch.export.export(Attend(form), inputs(device, dtype, 2, 5, 100), dynamic_shapes=dims, strict=False)
    # single-threaded: the timing captures the package in a CUDA graph, which a multi-threaded one's events forbid
    path = torch._inductor.aoti_compile_and_package(program, package_path=f"{folder}/{form}.pt2")
    return torch._inductor.aoti_load_package(path, run_single_threaded=True)


def prompt_lines(device: str, dtype, timed) -> list[str]:
    """Lines: the prompt form packaged against the sdpa form (both packaged) per case, then each at prefill 512
    (past 0) timed (`timed`: torch_kernels.timed, a CUDA graph's replays), or the failure."""
    label = "prompt attention (flash causal over a span ending at the last position) in an AOTInductor package"
    lines = []
    try:
        with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
            runners = {form: packaged(form, device, dtype, folder) for form in ("sdpa", "prompt")}
            said = []
            for batch, seq, past in ((1, 512, 0), (1, 500, 0), (2, 64, 300), (1, 2, 4000)):
                args = inputs(device, dtype, batch, seq, past)
                want, got = (runners[form](*args) for form in ("sdpa", "prompt"))
                want, got = (x[0] if isinstance(x, (list, tuple)) else x for x in (want, got))
                said.append(f"b{batch} seq {seq} past {past}: rel err "
                            f"{float((got.float() - want.float()).abs().max() / want.float().abs().max()):.1e}")
            lines.append(f"{label}: compiled and ran against the sdpa form's package ({'; '.join(said)})")
            print(lines[-1], flush=True)
            args = inputs(device, dtype, 1, 512, 0)
            for form, runner in runners.items():
                seconds = timed(lambda r=runner: r(*args), device)
                lines.append(f"{form} form packaged, prefill 512 (past 0, span 512), one layer: {seconds * 1e6:.1f} us")
                print(lines[-1], flush=True)
    except Exception as exc:  # noqa: BLE001 - the answer is the failure
        from torch_kernels import failure_line  # bench/: the package checks' one-line failure

        lines.append(failure_line(label, exc))
        print(lines[-1], flush=True)
    return lines
