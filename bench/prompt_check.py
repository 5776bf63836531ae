"""Whether AOTInductor packages softsyn's prompt attention form (torch_attention_forms.prompt_attention: flash
attention's causal form over a span that ends at the step's last position, no mask, query heads grouped in the kernel)
with batch, positions and span dynamic, and whether it computes the sdpa form's function at a first prompt and at a
continuation (past > 0), then times both forms packaged at prefill 512, with the kernels each launches. Beside them
a probe (session 26): the prompt form through flash attention's variable-length entry point (Varlen, batch 1),
compared and timed the same way. Part `prompt` of bench/torch_kernels.py; its lines printed as they come, so a call
cut short still says. The varlen probe's answer (H100, 2026-12-08,
bench/results/torch-kernels-prompt-h100-2026-12-08.md): its unsplit kernel took 21.8 us a layer at prefill 512 where
the split-KV kernel and its combine took 11.5 + 8.6, so the prompt form stays."""
from __future__ import annotations

import tempfile

import torch

HEADS, KV_HEADS, HEAD_DIM, CACHE = 16, 8, 128, 4160  # qwen3-1.7b's attention, its kv_cache.max_length


class Attend(torch.nn.Module):
    """One attention form as a step calls it: q [B, H, S, D] (transposed from [B, S, H, D]), the cache's first
    `span` slots (span = slots' length), the step's mask."""

    def __init__(self, form: str):
        super().__init__()
        from softsyn.emit.torch_attention_forms import ATTENTIONS

        self.function = ATTENTIONS[form][1]

    def forward(self, q, keys, values, positions, slots):
        span = slots.shape[0]
        mask = (slots[None, None, :] <= positions[:, :, None])[:, None]
        return self.function(None, q.transpose(1, 2), keys[:, :, :span], values[:, :, :span], mask,
                             HEAD_DIM ** -0.5)[0]


class Varlen(torch.nn.Module):
    """The prompt form through flash attention's variable-length entry point (`aten._flash_attention_forward` with
    cumulative lengths), batch 1: one sequence of `seq` queries against the span's keys, causal aligned to the bottom
    right as the batched entry point aligns it. Why try it: upstream FlashAttention-2's varlen path splits the keys
    only for a decode step's swapped query groups, where its batched path split a 512-row prompt's (16 heads x 4 row
    blocks leave the H100's 132 SMs idle): qwen3-1.7b's prefill 512 ran FA2's split-KV kernel and its combine, 0.318
    + 0.239 ms of 3.939 (H100, 2026-12-07 14:43). Whether torch's vendored copy does the same is what the timing and
    the kernel names say."""

    def forward(self, q, keys, values, positions, slots):
        span, seq = slots.shape[0], q.shape[1]
        # [span, Hkv, D] views of the cache: the kernel takes any row and head stride (each row's D values contiguous)
        k, v = (t[0, :, :span].transpose(0, 1) for t in (keys, values))
        zero = torch.zeros(1, dtype=torch.int32, device=q.device)
        cum_q = torch.cat([zero, torch.full((1,), seq, dtype=torch.int32, device=q.device)])
        cum_k = torch.cat([zero, torch.full((1,), span, dtype=torch.int32, device=q.device)])
        return varlen(q, k, v, cum_q, cum_k)


class VarlenGiven(torch.nn.Module):
    """Varlen with the cumulative lengths given (a step would build them once for all its layers, where Varlen builds
    them in two small kernels per call): the flash kernel's own time, what a package of 28 layers would pay a layer."""

    def forward(self, q, keys, values, positions, slots, cum_q, cum_k):
        span = slots.shape[0]
        k, v = (t[0, :, :span].transpose(0, 1) for t in (keys, values))
        return varlen(q, k, v, cum_q, cum_k)


PROBES = {"varlen": Varlen, "varlen_given": VarlenGiven}  # the varlen forms, batch 1: probes beside the two forms


def varlen(q, k, v, cum_q, cum_k):
    """Flash's variable-length forward of one sequence (batch 1): q [1, seq, H, D], k and v [span, Hkv, D]."""
    out = torch.ops.aten._flash_attention_forward(q[0], k, v, cum_q, cum_k, q.shape[1], k.shape[0], 0.0, True, False,
                                                  scale=HEAD_DIM ** -0.5)[0]
    return out[None]


def inputs(device: str, dtype, batch: int, seq: int, past: int, form: str = "sdpa") -> tuple:
    """`form`'s arguments at one case (varlen_given: the cumulative lengths after the others)."""
    g = torch.Generator(device=device).manual_seed(seq + past)
    cache = [torch.randn(batch, KV_HEADS, CACHE, HEAD_DIM, generator=g, device=device, dtype=dtype) for _ in range(2)]
    positions = torch.arange(past, past + seq, device=device).expand(batch, seq).contiguous()
    args = (torch.randn(batch, seq, HEADS, HEAD_DIM, generator=g, device=device, dtype=dtype), *cache, positions,
            torch.arange(past + seq, device=device))
    if form != "varlen_given":
        return args
    return *args, *(torch.tensor([0, n], dtype=torch.int32, device=device) for n in (seq, past + seq))


def packaged(form: str, device: str, dtype, folder: str):
    """`form`'s package (batch, positions and span dynamic; "varlen" and "varlen_given": batch 1, Varlen and
    VarlenGiven)."""
    auto = torch.export.Dim.AUTO
    dims = ({0: auto, 1: auto}, {0: auto}, {0: auto}, {0: auto, 1: auto}, {0: auto})
    if form in PROBES:
        dims = ({1: auto}, None, None, {1: auto}, {0: auto}) + ((None, None) if form == "varlen_given" else ())
    module, batch = (PROBES[form](), 1) if form in PROBES else (Attend(form), 2)
    program = torch.export.export(module, inputs(device, dtype, batch, 5, 100, form), dynamic_shapes=dims,
                                  strict=False)
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
            for probe in PROBES:
                try:
                    runners[probe] = packaged(probe, device, dtype, folder)
                except Exception as exc:  # noqa: BLE001 - a probe: the other forms are still compared and timed
                    from torch_kernels import failure_line  # bench/: the package checks' one-line failure

                    lines.append(failure_line(f"prompt attention through flash's varlen entry point ({probe})", exc))
                    print(lines[-1], flush=True)
            said = []
            for batch, seq, past in ((1, 512, 0), (1, 500, 0), (2, 64, 300), (1, 2, 4000)):
                want = first(runners["sdpa"](*inputs(device, dtype, batch, seq, past)))
                for form in [f for f in runners if f != "sdpa" and (f not in PROBES or batch == 1)]:
                    got = first(runners[form](*inputs(device, dtype, batch, seq, past, form)))
                    said.append(f"{form} b{batch} seq {seq} past {past}: rel err "
                                f"{float((got.float() - want.float()).abs().max() / want.float().abs().max()):.1e}")
            lines.append(f"{label}: compiled and ran against the sdpa form's package ({'; '.join(said)})")
            print(lines[-1], flush=True)
            for form, runner in runners.items():
                args = inputs(device, dtype, 1, 512, 0, form)
                seconds = timed(lambda r=runner, a=args: r(*a), device)
                lines.append(f"{form} form packaged, prefill 512 (past 0, span 512), one layer: {seconds * 1e6:.1f} us "
                             f"(kernels, us each in one profiled call: {', '.join(kernel_times(runner, args))})")
                print(lines[-1], flush=True)
    except Exception as exc:  # noqa: BLE001 - the answer is the failure
        from torch_kernels import failure_line  # bench/: the package checks' one-line failure

        lines.append(failure_line(label, exc))
        print(lines[-1], flush=True)
    return lines


def first(out):
    """A package's result: its only output."""
    return out[0] if isinstance(out, (list, tuple)) else out


def kernel_times(runner, args) -> list[str]:
    """The CUDA kernels one call of `runner` launches, in order: each name (cut at 40 characters) and its device time
    in us (the call warmed first: a first call's times include one-off work)."""
    runner(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        runner(*args)
        torch.cuda.synchronize()
    return [f"{e.name[:40]} {e.device_time_total:.1f}" for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]

