"""Whether AOTInductor packages softsyn's attention prologue (softsyn::attention_prologue: q/k RMS norm, rotary and
q's layout in one Triton kernel, softsyn.emit.triton_prologue) followed by the fused attention's cache write (two
index_copy_) with batch and positions dynamic, writes the caller's cache in place, and launches no copy of the cache
(a functionalised mutation Inductor did not write in place would copy it: a kernel of the cache's size each layer). Part `package` of bench/torch_kernels.py; one
line, printed first so a call cut short still says. Unmeasured on a GPU until that line comes back (2026-12-06)."""
from __future__ import annotations

import tempfile

import torch

HEADS, KV_HEADS, HEAD_DIM, CACHE = 16, 8, 128, 4160  # qwen3-1.7b's attention, its kv_cache.max_length
EPS = 1e-6


class Prologue(torch.nn.Module):
    """The op as a decode step calls it, with Qwen3's q and k norm weights."""

    def __init__(self, device: str, dtype):
        super().__init__()
        self.q_weight = torch.nn.Parameter(torch.rand(HEAD_DIM, device=device, dtype=dtype) + 0.5)
        self.k_weight = torch.nn.Parameter(torch.rand(HEAD_DIM, device=device, dtype=dtype) + 0.5)

    def forward(self, qkv, cos, sin, keys, values, where):
        from softsyn.emit.torch_step import BufferLayer

        q, k_rows, v_rows = torch.ops.softsyn.attention_prologue(qkv, self.q_weight, self.k_weight, cos, sin,
                                                                 KV_HEADS, EPS)
        BufferLayer(keys, values, where, keys.shape[2]).update(k_rows, v_rows)  # the fused attention's cache write
        return q


def inputs(device: str, dtype, batch: int, seq: int, past: int) -> tuple:
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    angles = torch.rand(batch, seq, HEAD_DIM, device=device) * 6.28
    return (torch.randn(batch, seq, width, device=device, dtype=dtype), angles.cos().to(dtype),
            angles.sin().to(dtype), *(torch.randn(batch, KV_HEADS, CACHE, HEAD_DIM, device=device, dtype=dtype)
                                      for _ in range(2)),
            torch.arange(past, past + seq, device=device))


def kernels_of(call) -> list[str]:
    """The GPU kernels one call launches (names), after one untimed call."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    # a C++ kernel's name carries its template arguments (kilobytes for ATen's): the part before them says which
    return [e.name.split("<")[0].split("(")[0] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def prologue_packaged(device: str, dtype) -> str:
    """One line: compiled and ran (q's and the cache's relative error per case, the kernels one call launches), or
    the failure."""
    from softsyn.emit import triton_prologue  # registers softsyn::attention_prologue (and its reference)

    label = "softsyn attention prologue in an AOTInductor package (batch, positions dynamic; cache written in place)"
    module = Prologue(device, dtype)
    auto = torch.export.Dim.AUTO
    dims = ({0: auto, 1: auto}, {0: auto, 1: auto}, {0: auto, 1: auto}, {0: auto}, {0: auto}, {0: auto})
    try:
        with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
            program = torch.export.export(module, inputs(device, dtype, 2, 3, 100), dynamic_shapes=dims, strict=False)
            runner = torch._inductor.aoti_load_package(
                torch._inductor.aoti_compile_and_package(program, package_path=f"{folder}/check.pt2"))
            said = []
            for batch, seq, past in ((1, 1, 512), (1, 1, 4095), (2, 5, 300)):
                args = inputs(device, dtype, batch, seq, past)
                mine = [a.clone() for a in args]
                want, k_rows, v_rows = triton_prologue.reference(args[0], module.q_weight, module.k_weight,
                                                                 *args[1:3], KV_HEADS, eps=EPS)
                args[3].index_copy_(2, args[5], k_rows)
                args[4].index_copy_(2, args[5], v_rows)
                got = runner(*mine)
                got = got[0] if isinstance(got, (list, tuple)) else got
                errs = [float((a.float() - b.float()).abs().max() / b.float().abs().max())
                        for a, b in ((got, want), (mine[3], args[3]), (mine[4], args[4]))]
                said.append(f"b{batch} seq {seq} past {past}: q {errs[0]:.1e}, keys {errs[1]:.1e}, values "
                            f"{errs[2]:.1e}")
            args = inputs(device, dtype, 1, 1, 512)  # made before the profile: only the package's own kernels count
            names = kernels_of(lambda: runner(*args))
        return f"{label}: compiled and ran ({'; '.join(said)}); a call launches {len(names)}: {', '.join(names)}"
    except Exception as exc:  # noqa: BLE001 - the answer is the failure
        from torch_kernels import failure_line  # bench/: the package checks' one-line failure

        return failure_line(label, exc)
