"""softsyn::attention_step on CUDA at qwen3-1.7b's attention (16/8 heads of 128, a 4160-slot cache): eagerly against
its parts' torch forms, then as an AOTInductor package (span dynamic), its kernels listed: whether the op writes the
cache in place with no copy of it. Run with CUDA_LAUNCH_BLOCKING=1 to find a kernel's illegal access."""
import sys

import torch

from softsyn.emit.triton_attention import reference as attention_reference
from softsyn.emit.triton_prologue import attention_step, reference

DEV, B, S, H, K, D, L = "cuda", 1, 1, 16, 8, 128, 4160


class Step(torch.nn.Module):
    """The op as a decode step calls it, its norm weights fixed."""

    def __init__(self, w):
        super().__init__()
        self.w = w

    def forward(self, qkv, cos, sin, keys, values, where, mask):
        return attention_step(qkv, self.w, self.w, cos, sin, keys, values, where, mask, 1e-6, D ** -0.5)


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/attention_step_check.py: needs a CUDA device (the op's Triton kernels)", file=sys.stderr)
        return 2
    qkv = torch.randn(B, S, (H + 2 * K) * D, device=DEV, dtype=torch.float16)
    w = torch.ones(D, device=DEV, dtype=torch.float16)
    ang = torch.rand(1, S, D, device=DEV)
    cos, sin = ang.cos().half(), ang.sin().half()
    keys, values = (torch.randn(B, K, L, D, device=DEV, dtype=torch.float16) for _ in range(2))
    where, span = torch.tensor([510], device=DEV), 768
    mask = (torch.arange(span, device=DEV) <= 510).expand(B, S, span).contiguous()
    k0, v0 = keys.clone(), values.clone()
    q, kr, vr = reference(qkv, w, w, cos, sin, kv_heads=K, eps=1e-6)
    k0.index_copy_(2, where, kr)
    v0.index_copy_(2, where, vr)
    want = attention_reference(q, k0[:, :, :span], v0[:, :, :span], mask, D ** -0.5)
    try:
        out = attention_step(qkv, w, w, cos, sin, keys, values, where, mask, 1e-6, D ** -0.5)
        torch.cuda.synchronize()
        print("eager ok", float((out.float() - want.float()).abs().max()),
              float((keys.float() - k0.float()).abs().max()))
    except Exception as e:  # noqa: BLE001 - the answer is the failure
        print("eager FAIL", type(e).__name__, str(e)[:300])
    try:
        args = (qkv, cos, sin, keys, values, where, mask)
        ep = torch.export.export(Step(w), args, dynamic_shapes=(None,) * 6 + ({2: torch.export.Dim.AUTO},),
                                 strict=False)
        path = torch._inductor.aoti_compile_and_package(ep, package_path="/tmp/attention-step.pt2")
        package = torch._inductor.aoti_load_package(path)
        out2 = package(*args)
        torch.cuda.synchronize()
        print("aoti ok", float((out2.float() - want.float()).abs().max()))
        with torch.profiler.profile() as prof:
            package(*args)
            torch.cuda.synchronize()
        print("kernels:", [e.name[:60] for e in prof.events() if e.device_type.name == "CUDA"][:12])
    except Exception as e:  # noqa: BLE001 - the answer is the failure
        print("aoti FAIL", type(e).__name__, str(e)[:600])
    return 0


if __name__ == "__main__":
    sys.exit(main())
