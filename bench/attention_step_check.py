"""softsyn::attention_step on CUDA at qwen3-1.7b's attention (16/8 heads of 128, a 4160-slot cache): eagerly against
its parts' torch forms, then as an AOTInductor package (span dynamic), its kernels listed: whether the op writes the
cache in place with no copy of it. Run with CUDA_LAUNCH_BLOCKING=1 to find a kernel's illegal access. The inputs and
the kernel listing are bench/prologue_check.py's."""
import sys

import torch

from prologue_check import EPS, HEAD_DIM, KV_HEADS, inputs, kernels_of  # bench/: the prologue's package check
from softsyn.emit.triton_attention import reference as attention_reference
from softsyn.emit.triton_prologue import attention_step, reference

PAST, SPAN = 510, 768  # a decode step at position 510 over a span rounded up past it
SCALE = HEAD_DIM ** -0.5
REPEATS = 500


class Step(torch.nn.Module):
    """The op as a decode step calls it, its norm weights fixed, its combine folded into the split kernel or not."""

    def __init__(self, w, fold: bool):
        super().__init__()
        self.w, self.fold = w, fold

    def forward(self, qkv, cos, sin, keys, values, where, mask):
        return attention_step(qkv, self.w, self.w, cos, sin, keys, values, where, mask, EPS, SCALE, fold=self.fold)


def only(got) -> torch.Tensor:
    """A package's one output (a loaded package returns a list)."""
    return got[0] if isinstance(got, (list, tuple)) else got


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max())


def main() -> int:
    if not torch.cuda.is_available():
        print("bench/attention_step_check.py: needs a CUDA device (the op's Triton kernels)", file=sys.stderr)
        return 2
    qkv, cos, sin, keys, values, where = inputs("cuda", torch.float16, 1, 1, PAST)
    w = torch.ones(HEAD_DIM, device="cuda", dtype=torch.float16)
    mask = (torch.arange(SPAN, device="cuda") <= PAST).expand(1, 1, SPAN).contiguous()
    k0, v0 = keys.clone(), values.clone()
    q, k_rows, v_rows = reference(qkv, w, w, cos, sin, kv_heads=KV_HEADS, eps=EPS)
    k0.index_copy_(2, where, k_rows)
    v0.index_copy_(2, where, v_rows)
    want = attention_reference(q, k0[:, :, :SPAN], v0[:, :, :SPAN], mask, SCALE)
    for fold in (False, True):
        check(fold, (qkv, cos, sin, keys, values, where, mask), w, want, k0)
    return 0


def check(fold: bool, args: tuple, w: torch.Tensor, want: torch.Tensor, k0: torch.Tensor) -> None:
    """The op eagerly and packaged, `fold` or not: its errors, its kernels, the worst of REPEATS packaged runs."""
    form = "folded" if fold else "unfolded"
    try:
        out = Step(w, fold)(*args)
        torch.cuda.synchronize()
        print(f"{form} eager ok", error(out, want), error(args[3], k0))
    except Exception as e:  # noqa: BLE001 - the answer is the failure
        print(f"{form} eager FAIL", type(e).__name__, str(e)[:300])
    try:
        program = torch.export.export(Step(w, fold), args,
                                      dynamic_shapes=(None,) * 6 + ({2: torch.export.Dim.AUTO},), strict=False)
        package = torch._inductor.aoti_load_package(
            torch._inductor.aoti_compile_and_package(program, package_path=f"/tmp/attention-step-{form}.pt2"))
        got = package(*args)
        torch.cuda.synchronize()
        print(f"{form} aoti ok", error(only(got), want))
        print(f"{form} kernels:", kernels_of(lambda: package(*args)))
        # the folded combine (the last split program to count merges) is a cross-SM handoff: a race shows as a
        # wrong or stale row in some run, so the worst of many runs, each the same step (the cache write idempotent)
        worst = max(error(only(package(*args)), want) for _ in range(REPEATS))
        print(f"{form} aoti worst of {REPEATS} runs", worst)
    except Exception as e:  # noqa: BLE001 - the answer is the failure
        print(f"{form} aoti FAIL", type(e).__name__, str(e)[:600])


if __name__ == "__main__":
    sys.exit(main())
