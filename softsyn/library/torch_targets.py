"""The PyTorch targets (issue 28): an artifact of AOTInductor kernels (DIR/model.pt2) instead of an ONNX model.

A torch target has no library of its own yet: the design is timed with the ORT library of the same device
(`library`), an estimate of the same function, and the package is measured at compile end. `cpu-torch` runs fp32 on
the CPU; `h200-torch` runs fp16 on CUDA, its fixed-shape steps replayed as CUDA graphs (softsyn.runtime.torch_package).
Weights: the compile loop's per-cell choice, realised per module: int8 by torchao's weight-only layer on the CPU;
int4 on CUDA only (torchao's CPU int4 layouts need kernels its CPU wheel lacks); on CUDA int4 and int8 by torchao's
layer or softsyn's Triton kernel, whichever measures faster per precision and layer shape (`weight_kernel`;
softsyn.emit.triton_weights, softsyn.emit.torch_kernel_choice); fp8 by softsyn's kernel where a target's `weights`
names it (h200-torch's does).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


DTYPE_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # torch dtype name -> softsyn's
PREFILL_WEIGHTS = ("shared", "resident")  # TorchTarget.prefill_weights


@dataclass(frozen=True)
class TorchTarget:
    name: str
    device: str  # torch's device name the package is compiled for
    library: str  # the ORT library the design's STA uses (an estimate: the package is measured)
    dtype: str  # torch's dtype name of the weights, activations and KV cache
    attention: str  # torch_attention_forms.ATTENTIONS: "sdpa" (torch's fused kernels), "matmul", "split",
    # "by_seq", "softsyn" (softsyn's split decode kernels), or "measured" (the faster decode form of
    # softsyn.emit.torch_attention_choice.FORMS, timed on the device at the decode groups' spans)
    weights: tuple[str, ...] = ("int8",)  # quantised weight precisions the package builds (torchao weight-only;
    # softsyn.emit.torch_step.TORCHAO has a layer for each)
    prefill_attention: str | None = None  # a form for a second package that serves the steps of seq > 1
    # (DIR/model-prefill.pt2); None: DIR/model.pt2 serves every step
    weight_kernel: str = "torchao"  # an int4 or int8 cell's layer: "torchao" (int4: tinygemm's layout), "softsyn"
    # (softsyn.emit.triton_weights' Triton kernel, compiled into the package) or "measured" (the faster of the two
    # per precision and layer shape, timed on the device at compile time: softsyn.emit.torch_kernel_choice); fp8
    # cells, where `weights` builds them, always take softsyn's: torchao has no fast fp8 weight-only layer
    fused_prologue: str = "off"  # with softsyn's decode attention, each checked attention's q/k norm, rotary and
    # cache write as one kernel (softsyn.emit.torch_prologue), since a decode step is bound by its kernel count:
    # "off", "on", or "measured" (one more candidate of the measured attention choice, timed as the others are:
    # softsyn.emit.torch_attention_choice; with attention "measured" only)
    fused_norms: str = "off"  # "on": each decoder layer's RMS norm weights folded into the projections they feed
    # before quantisation, and at decode the norms and residual adds in its GEMVs where the layer's GEMVs are
    # softsyn's kernel and its attention in the fused form, with the prologue kernel or its torch form
    # (softsyn.emit.torch_norms, softsyn.emit.torch_prologue.prologues_for): two kernels a layer fewer
    prefill_weights: str = "shared"  # with a prefill package and softsyn's int4/fp8 layers: "shared" (it reads
    # model.pt2's packed weights and dequantises them at every prompt) or "resident" (it holds them dequantised, its
    # own fp16 copy, where the area budget admits the bytes: softsyn.emit.torch_lowering.prefill_residency)

    @property
    def float_precision(self) -> str:
        return DTYPE_PRECISION[self.dtype]


TORCH_TARGETS = {
    "cpu-torch": TorchTarget("cpu-torch", "cpu", "cpu-ort", "float32", "sdpa"),
    # matmul: SDPA's cuDNN kernel took 2.4 of a 5.1 ms decode step on the H200 (qwen3-1.7b, 2026-12-03 07:16); the
    # matmul form decodes at 512 in 2.80 ms but its softmax over a dynamic span took 136 us a layer at 4096 (13:10);
    # "split" (the softmax in chunks of slots) was slower alone at every shape (14:59), and the 136 us was the export's
    # 7-slot example (fixed: 2.17 ms at 512, 2.52 at 4096, 16:11); "by_seq" (matmul at decode, SDPA at prefill, where
    # SDPA measured faster alone) fails in the H200 image's torch 2.11 Inductor (AssertionError: ps1, 17:07), so
    # prefill gets a package of its own in SDPA's form: Inductor's mask + softmax took 48 us a layer at prefill 512
    # where SDPA measured 34 alone (prefill 512: 5.959 ms vs ORT's 4.945, 17:36)
    # int4 measured per shape at compile time: neither kernel is assumed faster on every card and shape (softsyn's
    # first kernel lost to cuBLAS fp16 on narrow layers; its fourth beat tinygemm 2.0-2.8x at every qwen3-0.6b shape,
    # H100, 2026-12-06, bench/results/torch-int4-qwen3-0.6b-h100-2026-12-06-c-compile.txt)
    # decode attention measured at compile time: neither form wins everywhere (H100, 2026-12-06, 28 layers' caches:
    # matmul / softsyn's split kernels 10.9 / 11.7 us a layer at 768 slots, 20.8 / 18.7 at 4160); the fused prologue
    # measured with them: it packaged and computed the cache exactly (H200, 2026-12-06) but was never timed in a step
    # prefill weights resident: dequantising int4 weights at every prompt took 1.447 of qwen3-1.7b's 6.072 ms prefill
    # 512 (H100, 2026-12-07, bench/results/torch-int4-qwen3-1.7b-h100-2026-12-07-signoff.rpt)
    # fused norms: qwen3-1.7b's int4 decode step ran the two residual add + RMSNorm kernels a layer at ~2.7 and
    # ~3.3 us, ~0.17 of its 1.513 ms (H100, 2026-12-07); docs/decisions/2026-12-06-triton-int4.md, session 21
    # prefill "prompt" (flash's causal over a span ending at the last position, no mask built, query heads grouped
    # in the kernel): the sdpa form's mask and stacked-query kernel took 0.39 and cuDNN's masked attention 0.49 of
    # qwen3-1.7b's 4.23 ms int4 prefill 512 (H100, 2026-12-07); built in sdpa where AOTInductor refuses it
    # fp8: softsyn's kernel beat cuBLAS fp16 at every decode GEMV, weights read from device memory (qwen3-1.7b
    # layer 33.6 vs 48.0 us, lm_head 101.8 vs 205.9; H100, 2026-12-06,
    # bench/results/torch-kernels-chain-h100-2026-12-06-cold.md)
    "h200-torch": TorchTarget("h200-torch", "cuda", "h200-ort-cuda", "float16", "measured", ("int8", "int4", "fp8"),
                              prefill_attention="prompt", weight_kernel="measured", fused_prologue="measured",
                              prefill_weights="resident", fused_norms="on"),
}


def torch_target(name: str | None) -> TorchTarget | None:
    """The torch target `name` names, None for any other target (a library name or file)."""
    return TORCH_TARGETS.get(name) if isinstance(name, str) else None


def torch_target_problem(target: TorchTarget, spec: str) -> str | None:
    """Why `target` cannot lower `spec`, None when it can: a plain ONNX file (the torch targets build the source model
    in torch, which an ONNX file does not hold). A CUDA target on a machine without CUDA is refused when the package is
    compiled (softsyn.emit.torch_lowering): analyze and --plan need no device."""
    if Path(str(spec)).suffix.lower() == ".onnx" and not str(spec).startswith("zoo:"):
        return (f"target {target.name} lowers the source model in torch, which a plain ONNX file ({spec}) does not "
                "hold; give a zoo name (zoo:qwen3-tiny), a Hugging Face model folder or its config.json, or an ORT "
                "target (cpu-ort)")
    return None


def narrow_constraints(target: TorchTarget, cons) -> str | None:
    """Narrow the compile's constraints (in memory; the file is untouched) to what `target`'s package builds: weight
    precisions among its float one and `target.weights`, a KV cache of its float dtype (the loop's int8 GQA cache has
    no torch counterpart yet). The compile log's line saying so, None when nothing was narrowed."""
    keep = (target.float_precision, *target.weights)
    allowed = [p for p in cons.precision.allowed if p in keep] or [target.float_precision]
    said = []
    dropped = [p for p in cons.precision.allowed if p not in allowed]
    if dropped:
        said.append(f"precision.allowed {', '.join(cons.precision.allowed)} -> {', '.join(allowed)} (the package builds "
                    f"{', '.join(keep)})")
        cons.precision.allowed = allowed
    if cons.precision.default not in (None, *allowed):
        said.append(f"precision.default {cons.precision.default} -> {target.float_precision}")
        cons.precision.default = target.float_precision
    if cons.kv_cache.dtype not in (None, target.float_precision):
        said.append(f"kv_cache.dtype {cons.kv_cache.dtype} -> {target.float_precision}")
    cons.kv_cache.dtype = target.float_precision  # pinned: the loop's KV dtype move stays off
    return f"target {target.name}: " + "; ".join(said) if said else None
