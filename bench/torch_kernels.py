"""The h200-torch lowering's kernel choices measured in isolation on the GPU: attention forms and packed projections.

    python bench/torch_kernels.py                 # CUDA (the H200: bash bench/h200_session.sh torchkernels)
    python bench/torch_kernels.py --device cpu    # a smoke run of the same code on the CPU (numbers mean little)

At qwen3-1.7b's shapes (16 query / 8 KV heads of 128, hidden 2048, MLP 6144; a static cache of 4160 positions), fp16:
  attention  torch_attention_forms.ATTENTIONS (sdpa: torch's fused kernels, cuDNN's on the H200 with a mask;
             matmul: two matmuls and an fp32 softmax; split: the same with the softmax in chunks of slots; softsyn:
             softsyn.emit.triton_attention's split kernel, then whether AOTInductor packages it), decode
             (seq 1) over past 512 and 4096 and prefill (seq 512), over the span the package reads, each compiled by
             torch.compile (Inductor, as AOTInductor compiles the step) with static and with dynamic shapes (the
             package's) and replayed as a CUDA graph;
  projections q/k/v and gate/up as separate F.linear calls vs one PackedLinear matmul per group, the same way; then
             (CUDA) every decode GEMV shape under Inductor's settings (default, coordinate descent, max-autotune) and
             written as mul + sum, the kernels a decode-only program could have;
  int4       (CUDA) the packed q/k/v, packed gate/up and down GEMVs as fp16 against torchao's int4 weight-only layer
             in tinygemm's layout (softsyn.emit.torch_step.int4_config, what h200-torch builds for an int4 cell) at
             group sizes 32 and 128, the way the step runs them (an fp16 activation cast to bf16 and back);
  softsyn    (CUDA) softsyn's own int4 kernel (softsyn.emit.triton_weights: a Triton kernel as a torch.library.triton_op,
             what h200-torch builds for an int4 cell when TorchTarget.int4 is "softsyn") at group sizes 64 and 128,
             at decode (one row) and at prefill (512 rows), against fp16 cuBLAS, each with its relative error; then
             whether AOTInductor packages a step holding it and runs it from the package with the eager result;
  gemlite    (CUDA, where the gemlite wheel is installed: docs/h200.md) the same GEMVs through gemlite's Triton kernels
             (GEMV RevSplit-K at batch 1): A16W8 int8 and fp8 (per-channel scales, gemlite's own quantiser) and A16W4
             at group sizes 64 and 128 (round-to-nearest asymmetric groups packed in the HQQ format), each with its
             relative error against the fp16 layer; then whether AOTInductor packages a step holding a gemlite layer
             (gemlite registers a Python custom op: a package may need gemlite imported where it loads).
  attnchain  (CUDA) the decode attention forms a measured choice compares (matmul, softsyn's kernels at 32, 64 and 128
             splits a KV head) as 28 calls over cold copies of the cache in one CUDA graph (the graph the compile's
             choice times) at past 512 and 4096, per layer, with the kernels of a replay per layer;
  chain      (CUDA) each decode GEMV as a step runs it: 24 eager calls in one CUDA graph over distinct copies of the
             layer (its weights read from device memory, not the L2 cache), per call, for cuBLAS fp16, softsyn's int4
             (g64, g128), fp8 and int8 (g128) autotuned and int4 g128 at each config of a sweep, torchao's tinygemm
             int4 and int8 and gemlite's A16W4 / A16W8 fp8: a GEMV replayed alone reads a floor of ~10-14 us whatever
             its kernel, so the tables above compare small shapes only here;
  layerchain (CUDA) a step's GEMVs layer after layer, 28 layers, fp16 cuBLAS and softsyn's int4, without and with an
             RMSNorm kernel between them, and what a near-empty kernel costs in such a graph (bench/layer_chain.py);
  prologue   (CUDA) whether AOTInductor packages softsyn's attention prologue, writes the cache in place and launches
             no kernel beside it (bench/prologue_check.py; also under `package`);
  modulechain (CUDA) what the compile's measured attention choice times (softsyn.emit.torch_attention_choice): one
             qwen3-1.7b-wide decoder layer's attention module, its q/k/v int4 on softsyn's kernel, in each candidate
             (matmul, softsyn, softsyn + fused prologue) at past 767 and 4159, each line printed as it is timed: whether
             torch.compile traces the module there (it did not on 2026-12-07, H100: a fake tensor's address);
  prompt     (CUDA) the prompt attention form (flash's causal over a span ending at the last position) and the sdpa
             form, each an AOTInductor package with batch, positions and span dynamic: the same function at a first
             prompt and a continuation, and one layer's time at prefill 512 (bench/prompt_check.py);
  modulecompile (CUDA) modulechain's chains at span 768, each compiled by torch.compile (dynamic, then static
             shapes) and by torch.export + AOTInductor: which way times softsyn's attention ops (torch.compile failed
             on them on 2026-12-07, H100), each failure's traceback in the log;
  normchain  (CUDA) one qwen3-1.7b-wide int4 decoder layer as h200-torch's decode step holds it (gated MLP, fused
             prologue), a chain of 28 steps in one CUDA graph, its RMS norms as kernels and in its GEMVs
             (softsyn.emit.torch_norms), at spans 768 and 4160 (compiled by torch.compile, or where that fails as
             an AOTInductor package).
Each: median over 200 replays (after 20) of the graph, CUDA events; per call, and the bytes it must read (weights or
K/V) over that time as effective bandwidth. Writes a markdown table to -o (default stdout).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, MLP, CACHE = 16, 8, 128, 2048, 6144, 4160
NORM_EPS = 1e-6  # the normed GEMV rows' (Qwen3's RMS norm epsilon)


def timed(fn, device: str, runs: int = 200, warmup: int = 20) -> float:
    """Median seconds of one call of fn (compiled), replayed as a CUDA graph on CUDA."""
    for _ in range(3):
        fn()
    if device != "cuda":
        import time

        times = []
        for _ in range(runs // 10):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    from softsyn.emit.torch_kernel_choice import graph_of, replay_seconds

    return replay_seconds(graph_of(fn, warm=1), runs, warmup)


def causal_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """A first prompt's attention (past 0) in h200-torch's prefill form (torch_attention_forms.prompt_attention:
    flash's causal over a span ending at the last position), over the prompt's own slots: the step's span rounded up
    ends past them, which that form must not read."""
    from softsyn.emit.torch_attention_forms import ATTENTIONS

    seq = query.shape[2]
    return ATTENTIONS["prompt"][1](module, query, key[:, :, :seq], value[:, :, :seq], attention_mask[..., :seq],
                                   scaling)


def attention_rows(device: str, dtype) -> list[tuple]:
    """Each attention form at decode over past 512 and 4096 and at prefill 512, over the filled prefix rounded up to
    SPAN_STEP as the package reads it, compiled with static shapes and with dynamic ones (the package is exported
    with the span dynamic: Inductor's kernels differ, 2026-12-03: the whole softmax at 4096 took 136 us a layer in
    the package where the static bench took 21); the query in the layout the step gives it ([B, S, H, D] transposed);
    at prefill also causal_attention, a candidate for a first prompt."""
    from softsyn.emit.torch_attention_forms import ATTENTIONS
    from softsyn.runtime.torch_package import SPAN_STEP

    rows = []
    cache_k = torch.randn(1, KV_HEADS, CACHE, HEAD_DIM, device=device, dtype=dtype)
    cache_v = torch.randn_like(cache_k)
    for label, seq, past in (("decode", 1, 512), ("decode", 1, 4096), ("prefill", 512, 0)):
        span = min(CACHE, -(-(past + seq) // SPAN_STEP) * SPAN_STEP)
        q = torch.randn(1, seq, HEADS, HEAD_DIM, device=device, dtype=dtype).transpose(1, 2)
        k, v = cache_k[:, :, :span], cache_v[:, :, :span]
        positions = torch.arange(past, past + seq, device=device)[None]
        mask = (torch.arange(span, device=device)[None, None, :] <= positions[:, :, None])[:, None]
        # the prompt form must attend over a span ending at the last position: causal_attention gives it that
        forms = {form: function for form, (_, function) in ATTENTIONS.items() if form != "prompt"}
        if past == 0 and seq > 1:
            forms["causal (past 0)"] = causal_attention
            want = forms["sdpa"](None, q, k, v, mask, HEAD_DIM ** -0.5)[0].float()
            got = causal_attention(None, q, k, v, mask, HEAD_DIM ** -0.5)[0].float()
            print(f"causal (past 0) vs sdpa at prefill {seq}: rel err "
                  f"{float((got - want).abs().max() / want.abs().max()):.1e}", flush=True)
        for form, function in forms.items():
            for dynamic in (False, True):
                step = torch.compile(lambda q, k, v, m, f=function: f(None, q, k, v, m, HEAD_DIM ** -0.5)[0],
                                     dynamic=dynamic)
                seconds = timed(lambda: step(q, k, v, mask), device)
                kv_bytes = 2 * k.numel() * k.element_size()
                rows.append((f"attention {label} (seq {seq}, past {past}, span {span}, "
                             f"{'dynamic' if dynamic else 'static'} shapes)", form, seconds, kv_bytes / seconds))
    return rows


LAYERS = 28  # calls an attention chain holds (qwen3-1.7b's layers), over copies of the cache cold enough to read from memory


ATTENTION_SPLITS = (32, 64, 128)  # softsyn's kernels at each split count (its SPLITS: a package's is fixed)


def attention_chain_rows(device: str, dtype, forms=("matmul", "softsyn")) -> list[tuple]:
    """Each decode attention form as a step runs it, the graph the compile's measured choice times
    (softsyn.emit.torch_attention_choice.chain_graph) over LAYERS calls (each layer's K and V read from device memory,
    not the L2 cache), per layer; then the kernels of one replay (CUPTI, summed by name, per layer) so a form's time
    splits into its kernels. softsyn's kernels at each of ATTENTION_SPLITS (the shipped SPLITS first). Single-layer
    replays (attention_rows) read a launch floor a step does not pay."""
    from softsyn.emit import triton_attention
    from softsyn.emit.torch_attention_choice import AttentionShape, chain_graph
    from softsyn.emit.torch_kernel_choice import replay_seconds
    from softsyn.runtime.torch_package import attended_span

    shipped = triton_attention.SPLITS
    splits = (shipped, *(n for n in ATTENTION_SPLITS if n != shipped))
    variants = [(form, n) for form in forms for n in (splits if form == "softsyn" else (None,))]
    rows = []
    for past in (512, 4096):
        shape = AttentionShape(1, HEADS, KV_HEADS, HEAD_DIM, attended_span(past + 1, CACHE), CACHE)
        for form, n in variants:
            triton_attention.SPLITS = n or shipped  # read when the op is traced: each variant compiles afresh
            label = form if n in (None, shipped) else f"{form} ({n} splits)"
            try:
                graph = chain_graph(form, shape, dtype, device, calls=LAYERS)
                seconds = replay_seconds(graph) / LAYERS
                split = replay_kernels(graph, LAYERS)
            except Exception as exc:  # noqa: BLE001 - a form that fails here is a line, not a crash
                print(f"attention chain {label} past {past}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
                continue
            finally:
                torch._dynamo.reset()
            rows.append((f"attention decode chain (past {past}, span {shape.span}, {LAYERS} calls over cold cache "
                         f"copies, dynamic shapes; kernels a layer: {split})", label, seconds,
                         shape.kv_bytes(2) / seconds))
            print(f"attention chain past {past} | {label} | {seconds * 1e6:.1f} us a layer | {split}", flush=True)
            del graph
            torch.cuda.empty_cache()
    triton_attention.SPLITS = shipped
    return rows


def replay_kernels(graph, calls: int) -> str:
    """The kernels of one replay of `graph` (CUPTI), summed by name, per call: "name Nx us; ...", largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name[:48], []).append(event.device_time * 1e-6)
    return "; ".join(f"{name} {len(t) / calls:g}x {sum(t) / calls * 1e6:.1f}"
                     for name, t in sorted(kernels.items(), key=lambda kv: -sum(kv[1])))


GEMV_OPTIONS = {  # Inductor settings a package could be compiled with (aoti_compile_and_package's inductor_configs)
    "default": {},
    "coordinate descent": {"coordinate_descent_tuning": True},  # gpt-fast's setting: tunes Triton kernels' blocks
    "max-autotune": {"max_autotune_gemm": True, "coordinate_descent_tuning": True},  # Triton mm templates vs cuBLAS
}


def projection_rows(device: str, dtype) -> list[tuple]:
    """Decode's projections (seq 1): q/k/v and gate/up separate vs packed; then each packed group, o, down and the
    lm_head under GEMV_OPTIONS, and as mul + sum (what a decode-only program could write: Inductor makes the GEMV a
    Triton reduction it fuses and tunes, instead of a cuBLAS call)."""
    from softsyn.emit.torch_step import PackedLinear

    rows = []
    x = torch.randn(1, 1, HIDDEN, device=device, dtype=dtype)
    for label, widths in (("q/k/v", (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM)),
                          ("gate/up", (MLP, MLP))):
        linears = [torch.nn.Linear(HIDDEN, w, bias=False, device=device, dtype=dtype) for w in widths]
        packed = PackedLinear(linears)
        size = sum(lin.weight.numel() * lin.weight.element_size() for lin in linears)
        separate = torch.compile(lambda: [lin(x) for lin in linears], dynamic=False)
        together = torch.compile(lambda: [packed.part(i, x) for i in range(len(widths))], dynamic=False)
        for form, fn in (("separate", separate), ("packed", together)):
            seconds = timed(fn, device)
            rows.append((f"{label} projections (decode, {size / 1e6:.0f} MB of weights)", form, seconds, size / seconds))
    if device != "cuda":  # Inductor's GPU settings; the CPU smoke run stops here
        return rows
    for label, width_in, width_out in (("q/k/v packed", HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
                                       ("o", HEADS * HEAD_DIM, HIDDEN), ("gate/up packed", HIDDEN, 2 * MLP),
                                       ("down", MLP, HIDDEN), ("lm_head", HIDDEN, 151936)):
        weight = torch.randn(width_out, width_in, device=device, dtype=dtype) * width_in ** -0.5
        inp = torch.randn(1, 1, width_in, device=device, dtype=dtype)
        size = weight.numel() * weight.element_size()
        forms = [(f"linear, {name}", options, lambda w=weight, i=inp: torch.nn.functional.linear(i, w))
                 for name, options in GEMV_OPTIONS.items()]
        forms.append(("mul + sum, coordinate descent", GEMV_OPTIONS["coordinate descent"],
                      lambda w=weight, i=inp: (i[..., None, :] * w).sum(-1, dtype=torch.float32).to(i.dtype)))
        for form, options, fn in forms:
            torch._dynamo.reset()  # each form compiled under its own settings
            seconds = timed(torch.compile(fn, dynamic=False, options=options), device)
            rows.append((f"{label} {width_in}x{width_out} (decode, {size / 1e6:.0f} MB)", form, seconds, size / seconds))
    return rows


def int4_rows(device: str, dtype) -> list[tuple]:
    from torchao.quantization import quantize_

    from softsyn.emit.torch_step import int4_config

    rows = []
    x = torch.randn(1, 1, HIDDEN, device=device, dtype=dtype)
    for label, width_in, width_out in (("q/k/v packed", HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
                                       ("gate/up packed", HIDDEN, 2 * MLP), ("down", MLP, HIDDEN)):
        size = width_in * width_out * 2
        for form, block in (("fp16", 0), ("int4 g32", 32), ("int4 g128", 128)):
            linear = torch.nn.Linear(width_in, width_out, bias=False, device=device, dtype=dtype)
            if block:
                quantize_(linear.to(torch.bfloat16), int4_config(block))
            inp = x if width_in == HIDDEN else torch.randn(1, 1, width_in, device=device, dtype=dtype)
            seconds = timed(torch.compile(lambda lin=linear, i=inp: lin(i), dynamic=False), device)
            rows.append((f"{label} {width_in}x{width_out} (decode, {size / 1e6:.0f} MB at fp16)", form, seconds,
                         size / seconds))
    return rows


SHAPES = (("q/k/v packed", HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM), ("o", HEADS * HEAD_DIM, HIDDEN),
          ("gate/up packed", HIDDEN, 2 * MLP), ("down", MLP, HIDDEN), ("lm_head", HIDDEN, 151936))


def softsyn_int4_rows(device: str, dtype) -> list[tuple]:
    """softsyn's int4 kernel against F.linear at fp16, decode (1 row) and prefill (512 rows), compiled by Inductor
    (which inlines the triton_op's kernel and autotunes it at these shapes, as AOTInductor does per package)."""
    from softsyn.emit.triton_weights import QuantLinear

    rows = []
    for label, width_in, width_out in SHAPES:
        size = width_in * width_out * 2
        linear = torch.nn.Linear(width_in, width_out, bias=False, device=device, dtype=dtype)
        torch.nn.init.normal_(linear.weight, std=0.02)
        for seq in (1, 512):
            inp = torch.randn(1, seq, width_in, device=device, dtype=dtype)
            want = linear(inp).float()
            for form, layer in [("fp16", linear)] + [(f"softsyn int4 g{g}", QuantLinear.from_linear(linear, g))
                                                     for g in (64, 128)]:
                torch._dynamo.reset()
                try:
                    err = float((layer(inp).float() - want).abs().max() / want.abs().max())
                    seconds = timed(torch.compile(lambda lyr=layer, i=inp: lyr(i), dynamic=False), device)
                except Exception as exc:  # noqa: BLE001 - a form Triton refuses here is a line, not a crash
                    print(f"softsyn int4 {form} {label}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
                    continue
                what = "decode" if seq == 1 else f"prefill {seq}"
                rows.append((f"{label} {width_in}x{width_out} ({what}, {size / 1e6:.0f} MB at fp16)",
                             f"{form} (rel err {err:.1e})", seconds, size / seconds))
    return rows


# one-row configs of softsyn's kernel swept at int4 g128 in the chain (the shipped list, CONFIGS, is a subset chosen
# from such a sweep): outputs a program covers, weight rows of its chunk, warps
# one-row configs of softsyn's int4 kernel (outputs a program, bytes of each row a loop step, warps): 32 bytes a
# thread (two 16-byte loads). The 34 configs of 16-64 bytes a thread ranked within 10-20 % of each other at every
# qwen3-1.7b shape (H100, 2026-12-06, torch-kernels-chain-h100-2026-12-06-v5.md) and took most of a 540 s call
SWEEP = [(n, k, w) for n in (1, 2, 4, 8, 16, 32) for k in (256, 512, 1024) for w in (1, 2, 4, 8) if n * k == 1024 * w]


class Configured:
    """softsyn's kernel on a QuantLinear's buffers at one config (launch), and, where `checked`, its relative error
    against the product of the dequantised weight in fp32 (a form that computes wrongly shows as an error beside its
    time, not only as a speed: F16's and ASM's fp16 arithmetic, ASM's inline PTX)."""

    def __init__(self, layer, meta: dict, warps: int, gated: bool = False, checked: bool = False,
                 normed: bool = False):
        # one stage, as every tuned one-row config ships (triton_weights.one_row), unless `meta` says otherwise: at
        # Triton's default (3) a row marked shipped would not time what ships
        self.config = {"num_stages": 1, **meta, "num_warps": warps}
        self.layer, self.gated, self.checked = layer, gated, checked
        self.eps = NORM_EPS if normed else None  # NORM: x's rows RMS-normed in the kernel (a folded input norm)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from softsyn.emit.triton_weights import launch

        return launch(x, self.layer.packed, self.layer.scales, self.layer.lows, self.config, gated=self.gated,
                      norm_eps=self.eps)

    def error(self, x: torch.Tensor) -> float:
        """max |got - want| / max |want| on the row x."""
        from softsyn.emit.triton_weights import dequantise, rms_normed, silu_gated

        rows = x.float() if self.eps is None else rms_normed(x.float(), self.eps)
        want = rows @ dequantise(self.layer.packed, self.layer.scales, self.layer.lows).float().t()
        want = silu_gated(want).float() if self.gated else want
        return float((self(x).float() - want).abs().max() / want.abs().max())


def chain_rows(device: str, dtype, calls: int = 24) -> list[tuple]:
    """Decode GEMVs (one row) as a step runs them: `calls` eager calls captured in one CUDA graph, the replay's time /
    calls. A single call replayed alone reads a floor of ~10-14 us whatever the kernel (H200 2026-12-03, H100
    2026-12-06), so small shapes compare forms only in a chain. The calls rotate over distinct copies of the layer
    (softsyn.emit.torch_kernel_choice.cold_copies, for the int4 codes, the smallest form's) so that each reads its
    weights from device memory as a step does, not from the L2 cache (the chain tables in bench/results before
    torch-kernels-chain-h100-2026-12-06-cold.md read one layer's). Forms: chain_forms; a checked form's (F16, ASM)
    relative error, the largest over its copies, follows its name."""
    from softsyn.emit.torch_kernel_choice import cache_bytes, cold_copies

    try:
        import gemlite
        gemlite.load_config(str(Path(gemlite.__file__).parent / "configs" / "h100.json"), print_error=False)
    except ImportError:
        gemlite = None
    rows, cache = [], cache_bytes(device)
    for label, width_in, width_out in SHAPES:
        size = width_in * width_out * 2
        copies = cold_copies(width_in * width_out // 2, cache, calls)
        forms: dict[str, list] = {}
        for _ in range(copies):
            linear = torch.nn.Linear(width_in, width_out, bias=False, device=device, dtype=dtype)
            torch.nn.init.normal_(linear.weight, std=0.02)
            for form, layer in chain_forms(linear, gemlite if label != "lm_head" else None):
                forms.setdefault(form, []).append(layer)
        inputs = [torch.randn(1, width_in, device=device, dtype=dtype) for _ in range(calls)]
        for form, layers in forms.items():
            try:
                seconds = timed(lambda lyrs=layers: [lyrs[i % len(lyrs)](x) for i, x in enumerate(inputs)],
                                device) / calls
            except Exception as exc:  # noqa: BLE001 - a form that fails here is a line, not a crash
                print(f"chain {form} {label}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
                continue
            if getattr(layers[0], "checked", False):
                form = f"{form}, rel err {max(layer.error(inputs[0]) for layer in layers):.1e}"
            rows.append((f"{label} {width_in}x{width_out} (decode, {calls} calls a graph over {copies} copies, "
                         f"{size / 1e6:.0f} MB at fp16)", form, seconds, size / seconds))
            print(f"chain {label} | {form} | {seconds * 1e6:.1f} us", flush=True)  # kept if the run is cut short
        del forms
        torch.cuda.empty_cache()
    return rows


def chain_forms(linear: torch.nn.Linear, gemlite) -> list[tuple[str, object]]:
    """A chain's forms of one layer: cuBLAS fp16 (F.linear), the fp16 tensor-core prototype (bench/fp16_gemv.py),
    softsyn's (softsyn_chain_forms), torchao's tinygemm int4
    (the step's fp16 activation in, as h200-torch runs it) and int8 weight-only, gemlite's A16W4 g64 and A16W8 fp8
    where installed (gemlite's from_linear takes the layer's weight: a copy each)."""
    from torchao.quantization import quantize_

    from softsyn.emit.torch_step import int4_config, int8_config

    import fp16_gemv  # bench/: a prototype, not softsyn's yet

    forms = [("fp16 cuBLAS", linear),
             ("fp16 tensor-core GEMV (bench/fp16_gemv.py prototype, autotuned)",
              lambda x, w=linear.weight: fp16_gemv.gemv(x, w))] + softsyn_chain_forms(linear)
    tinygemm = copy.deepcopy(linear).to(torch.bfloat16)
    quantize_(tinygemm, int4_config(128))
    forms.append(("torchao int4 g128 (tinygemm)", tinygemm))
    int8 = copy.deepcopy(linear)
    quantize_(int8, int8_config(0))
    forms.append(("torchao int8 (Int8WeightOnlyConfig, per channel)", int8))
    if gemlite is not None:
        forms += [(f"gemlite {name}", gemlite_layer(copy.deepcopy(linear), bits, group))
                  for name, bits, group in (("A16W4 g64", 4, 64), ("A16W8 fp8", 8, -1))]
    return forms


def softsyn_chain_forms(linear: torch.nn.Linear) -> list[tuple[str, object]]:
    """softsyn's int4 (g64, g128), fp8 and int8 (g128) layers, autotuned (the kernel alone: its programs store
    finished sums into an empty output), then int4 g128 at each config of SWEEP and each F16 config (int4
    dequantised in fp16), and fp8 g128 at each one-row config of CONFIGS (its tuned ones marked shipped), to show the
    spread the autotuner chooses from and what it could; then int4 g128 at ASM_CONFIGS (inline PTX, int4's tuned
    configs), plain and on gate/up gated, beside F16's with the error of each (Configured)."""
    from softsyn.emit.torch_step import GatedGemv
    from softsyn.emit.triton_weights import ASM_CONFIGS, CONFIGS, QuantLinear, tuned_configs

    def tile(c):
        return c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.kwargs["X_TILE"], c.kwargs["F16"]

    walked = [tile(c) for c in CONFIGS]  # the fp32 and F16 forms' configs (int4's tuned ones are ASM's, below)
    shipped = {"int4": [], "fp8": [tile(c) for c in tuned_configs("fp8")]}  # the F16 rows at int4 are ASM's twins
    forms = []
    for precision, group in (("int4", 64), ("int4", 128), ("fp8", 128), ("int8", 128)):
        layer = QuantLinear.from_linear(linear, group, precision)
        forms.append((f"softsyn {precision} g{group} (autotuned)", layer))
        if linear.out_features == 2 * MLP and precision == "int4":  # gate/up: + the activation in the epilogue
            forms.append((f"softsyn {precision} g{group} gated (silu(gate) * up in the epilogue, autotuned)",
                          GatedGemv(layer)))
        if group != 128 or precision == "int8":  # int8 reads what fp8 reads: its configs rank the same
            continue
        # int4: the sweep, then the F16 configs (each row's own activations, int4 in fp16: triton_weights.CONFIGS);
        # fp8: every walked config, its tuned ones marked shipped
        sweep = SWEEP if os.environ.get("SWEEP", "1") != "0" else []  # SWEEP=0: the shipped configs alone (a short call)
        swept = [(*c, False, False) for c in sweep] + [c for c in walked if c[4]] if precision == "int4" else walked
        for n, k, w, x_tile, f16 in swept:
            meta = {"BLOCK_M": 1, "BLOCK_N": n, "BLOCK_K": k, "X_TILE": x_tile, "F16": f16}
            name = (f"BLOCK_N {n} BLOCK_K {k} warps {w}{' X_TILE' if x_tile and not f16 else ''}"
                    f"{' F16' if f16 else ''}{' (shipped)' if (n, k, w, x_tile, f16) in shipped[precision] else ''}")
            forms.append((f"softsyn {precision} g{group} {name}", Configured(layer, meta, w, checked=f16)))
        if precision == "int4":  # ASM's twins of the F16 configs, with F16's gated rows beside the gated ASM ones
            gated = (False, True) if linear.out_features == 2 * MLP else (False,)
            forms += [(f"softsyn int4 g128 BLOCK_N {c.kwargs['BLOCK_N']} BLOCK_K {c.kwargs['BLOCK_K']} warps "
                       f"{c.num_warps} {'ASM (shipped)' if asm else 'F16'}{' gated' if gate else ''}",
                       Configured(layer, {**c.kwargs, "ASM": asm}, c.num_warps, gated=gate, checked=True))
                      for c in ASM_CONFIGS for gate in gated for asm in (True, False) if asm or gate]
            # NORM (the input norm folded into q/k/v's and gate/up's GEMVs, softsyn.emit.torch_norms) at each ASM
            # config: its cost is the normed row's time over the plain one's
            forms += [(f"softsyn int4 g128 BLOCK_N {c.kwargs['BLOCK_N']} BLOCK_K {c.kwargs['BLOCK_K']} warps "
                       f"{c.num_warps} ASM normed{' gated' if gate else ''}",
                       Configured(layer, {**c.kwargs, "ASM": True}, c.num_warps, gated=gate, checked=True,
                                  normed=True))
                      for c in ASM_CONFIGS for gate in gated]
    return forms


def attention_layer_model(device: str, dtype):
    """(model, its attention module, the attention choice's Timing with the prologue offered): one decoder layer of
    qwen3-1.7b's widths, random weights, projections packed, q/k/v int4 g128 on softsyn's kernel."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from softsyn.emit.torch_attention_choice import attention_timing
    from softsyn.emit.torch_step import pack_projections
    from softsyn.emit.triton_weights import replace_linears

    config = Qwen3Config(hidden_size=HIDDEN, intermediate_size=MLP, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                         num_key_value_heads=KV_HEADS, num_hidden_layers=1, vocab_size=1024)
    model = Qwen3ForCausalLM(config).to(device=device, dtype=dtype).eval()
    pack_projections(model)
    attention = model.model.layers[0].self_attn
    replace_linears(model, [attention.packed_q_k_v.linear], 128)
    return model, attention, attention_timing(model, prologue=True)


def module_chain_lines(device: str, dtype) -> list[str]:
    """The measured attention choice's module chains, one layer of qwen3-1.7b's widths (random weights, q/k/v int4 g128
    on softsyn's kernel), each candidate at each span: a line per time or failure, printed as it ends."""
    from softsyn.emit.torch_attention_choice import AttentionShape

    timing = attention_layer_model(device, dtype)[2]
    lines = []
    for candidate in timing.candidates:
        for span in (768, 4160):
            shape = AttentionShape(1, HEADS, KV_HEADS, HEAD_DIM, span, CACHE)
            lines.append(chain_line(f"module chain {candidate.label} at span {span}",
                                    lambda: timing.timer(candidate, shape, dtype, device)))
    return lines


def module_compile_lines(device: str, dtype, span: int = 768,
                         ways: tuple[str, ...] = ("dynamic", "static", "AOTInductor")) -> list[str]:
    """The module chains of module_chain_lines at one span, each candidate compiled each of `ways` (all three by
    default, --ways on the command line): torch.compile with dynamic shapes (as the compile's choice does),
    torch.compile with static shapes, and torch.export + AOTInductor (as the package is built: its runner called per
    step in the CUDA graph), so a lease tells which way
    times softsyn's attention ops when the first fails (torch 2.11's Inductor did, 2026-12-07: `KeyError: 'op14'`
    and an AssertionError in decompose_triton_kernel_wrapper_functional), each with its kernels a layer. A
    failure's whole traceback goes to stderr (the session's torch-kernels.log)."""
    import tempfile
    import traceback

    from softsyn.emit.torch_attention_choice import AttentionShape, cold_caches, module_step, packaged_step
    from softsyn.emit.torch_kernel_choice import CALLS, graph_of, replay_seconds
    from softsyn.emit.torch_attention_forms import ATTENTIONS, attention_implementation

    model, attention, timing = attention_layer_model(device, dtype)
    shape = AttentionShape(1, HEADS, KV_HEADS, HEAD_DIM, span, CACHE)

    def compiled(one, calls, how: str, folder: str):
        if how != "AOTInductor":
            return torch.compile(one, dynamic=how == "dynamic")
        return packaged_step(attention, one, calls[0], Path(folder) / "chain.pt2")

    lines = []
    for candidate in timing.candidates:
        for how in ways:
            label = f"module chain {candidate.label} at span {span}, {how}"
            try:
                with (attention_implementation(attention, ATTENTIONS[candidate.form][0]), torch.no_grad(),
                      tempfile.TemporaryDirectory() as folder):
                    one, calls = module_step(attention, model.model.rotary_emb, candidate, shape,
                                             cold_caches(shape, dtype, device, CALLS))
                    step = compiled(one, calls, how, folder)
                    graph = graph_of(lambda: [step(*a) for a in calls])
                    seconds = replay_seconds(graph) / CALLS
                    # the kernels tell a copy the compiler added (a copied cache: aliased keys and values made the
                    # cache-writing prologue's chain ~18 us a layer slow on the H100, 2026-12-07) from the ops' own
                    line = f"{label}: {seconds * 1e6:.1f} us a layer (kernels a layer: {replay_kernels(graph, CALLS)})"
            except Exception as exc:  # noqa: BLE001 - the answer is the failure, its trace in the log
                traceback.print_exc()
                line = failure_line(label, exc)
            finally:
                torch._dynamo.reset()
            print(line, flush=True)
            lines.append(line)
    return lines


def chain_line(label: str, seconds) -> str:
    """`label` and what `seconds()` times, in us a layer, or its failure (what the compile's choice would log); printed
    as it ends, dynamo reset after (every chain compiles its own)."""
    try:
        line = f"{label}: {seconds() * 1e6:.1f} us a layer"
    except Exception as exc:  # noqa: BLE001 - the answer is the failure
        line = failure_line(label, exc)
    finally:
        torch._dynamo.reset()
    print(line, flush=True)
    return line


def norm_chain_lines(device: str, dtype, calls: int = 28) -> list[str]:
    """One qwen3-1.7b-wide decoder layer (random weights, every projection int4 g128 on softsyn's kernel, the MLP
    gated, the prologue fused: h200-torch's decode layer) as `calls` one-position steps in one CUDA graph, compiled as
    the package is (dynamic shapes), with its norms as kernels of their own and with them in its GEMVs
    (softsyn.emit.torch_norms), at spans 768 and 4160: a line per time or failure. One layer module serves every
    call, so its weights (21 MB) stay in the L2 cache: the two forms differ in the kernels between the GEMVs, which
    is what the line compares, not a step's time."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.cache_utils import Cache

    import tempfile

    from softsyn.emit.torch_attention_choice import AttentionShape, cold_caches, packaged_step
    from softsyn.emit.torch_kernel_choice import graph_of, replay_seconds
    from softsyn.emit.torch_norms import fold_norms, fuse_norms
    from softsyn.emit.torch_prologue import FUSED_FORM, fuse_prologues
    from softsyn.emit.torch_attention_forms import attention_implementation
    from softsyn.emit.torch_step import BufferLayer, fuse_gated_mlps, pack_projections
    from softsyn.emit.triton_weights import replace_linears

    config = Qwen3Config(hidden_size=HIDDEN, intermediate_size=MLP, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                         num_key_value_heads=KV_HEADS, num_hidden_layers=1, vocab_size=1024)
    model = Qwen3ForCausalLM(config).to(device=device, dtype=dtype).eval()
    pack_projections(model)
    fold_norms(model)
    layer = model.model.layers[0]
    replace_linears(model, [layer.self_attn.packed_q_k_v.linear, layer.self_attn.o_proj,
                            layer.mlp.packed_gate_up.linear, layer.mlp.down_proj], 128)
    fuse_gated_mlps(model)
    fuse_prologues(model)
    unfused = model.model.layers[0]
    fusion = fuse_norms(model)
    forms = [("norm kernels", unfused)]
    forms += [("norms in the GEMVs", model.model.layers[0])] if fusion.done else []
    lines = [] if fusion.done else [f"norm chain: the layer did not fuse ({fusion.why})"]
    rows = [torch.randn(1, 1, HIDDEN, device=device, dtype=dtype) for _ in range(calls)]
    for span in (768, 4160):
        shape = AttentionShape(1, HEADS, KV_HEADS, HEAD_DIM, span, CACHE)
        caches = cold_caches(shape, dtype, device, calls)
        where = torch.tensor([span - 2], device=device)
        mask = (torch.arange(span, device=device) <= where[0]).expand(1, 1, 1, span).contiguous()
        cos, sin = model.model.rotary_emb(rows[0], where.expand(1, 1))
        for label, module in forms:
            def one(x, keys, values, where, mask, cos, sin, module=module):  # packaged_step's convention
                cache = Cache(layers=[BufferLayer(keys, values, where, mask.shape[-1])])
                out = module(x, attention_mask=mask, position_embeddings=(cos, sin), position_ids=where.expand(1, 1),
                             cache=cache, use_cache=True)
                return out[0] if isinstance(out, tuple) else out

            def seconds(one=one, module=module, packaged=False):
                args = [(x, *caches[i % len(caches)], where, mask, cos, sin) for i, x in enumerate(rows)]
                with (attention_implementation(module.self_attn, FUSED_FORM), torch.no_grad(),
                      tempfile.TemporaryDirectory() as folder):
                    step = (packaged_step(module, one, args[0], Path(folder) / "layer.pt2") if packaged
                            else torch.compile(one, dynamic=True))
                    graph = graph_of(lambda: [step(*a) for a in args])
                    return replay_seconds(graph) / calls
            line = chain_line(f"norm chain, {label}, span {span}", seconds)
            if "failed (" in line:  # torch 2.11's Inductor fails on softsyn's ops in torch.compile: as the package is
                line = chain_line(f"norm chain, {label}, span {span}, as an AOTInductor package",
                                  lambda seconds=seconds: seconds(packaged=True))
            lines.append(line)
    return lines


def package_check(label: str, module: torch.nn.Module, example: tuple, dims, cases: list[tuple], want) -> str:
    """Whether AOTInductor packages `module` (exported at `example` with `dynamic_shapes` `dims`) and the package
    gives `want(*args)` for every args of `cases`: one line, the relative error per case or the failure."""
    import tempfile

    try:
        with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
            program = torch.export.export(module, example, dynamic_shapes=dims, strict=False)
            path = torch._inductor.aoti_compile_and_package(program, package_path=f"{folder}/check.pt2")
            runner = torch._inductor.aoti_load_package(path)
            errs = []
            for name, args in cases:
                got = runner(*args)
                got = got[0] if isinstance(got, (list, tuple)) else got
                expected = want(*args).float()
                errs.append(f"{name} {float((got.float() - expected).abs().max() / expected.abs().max()):.1e}")
        return f"{label}: compiled and ran (rel err {', '.join(errs)})"
    except Exception as exc:  # noqa: BLE001 - the answer is the failure
        return failure_line(label, exc)


def failure_line(label: str, exc: BaseException) -> str:
    """A package check's failure on one line: its head and, past 200 characters, its last 600 (a traceback's cause
    is at its end)."""
    text = " ".join(str(exc).split())
    return f"{label}: failed ({type(exc).__name__}: {text[:200]}{' ... ' + text[-600:] if len(text) > 200 else ''})"


VOCAB = 151936  # qwen3's lm_head outputs


def softsyn_int4_packaged(device: str, dtype) -> str:
    """Whether AOTInductor packages a gated MLP of softsyn's layers (int4 gate/up at group 32, qwen3-1.7b's int4 map's
    group for most layers, with the activation in its epilogue; fp8 down: GatedMLP, as the lowering builds one) and
    an int4 g128 lm_head of qwen3's vocabulary after it, its input [batch, seq, K] with both dims dynamic (as a decode
    step's: the rows are their product), and the package gives the unfused eager result. (qwen3-0.6b's int4 package
    failed in AOTInductor's autotuning block, H100, 2026-12-06 18:50, in a part both attention forms hold.)"""
    from softsyn.emit.torch_step import GatedMLP
    from softsyn.emit.triton_weights import QuantLinear

    linear = torch.nn.Linear(HIDDEN, 2 * MLP, bias=False, device=device, dtype=dtype)
    back = torch.nn.Linear(MLP, HIDDEN, bias=False, device=device, dtype=dtype)
    gate_up, down = QuantLinear.from_linear(linear, 32), QuantLinear.from_linear(back, 128, "fp8")
    head = QuantLinear.from_linear(torch.nn.Linear(HIDDEN, VOCAB, bias=False, device=device, dtype=dtype), 128)
    down.config, head.config = 1, 2  # pinned configs, as the compile's measured choice leaves them (gate/up tuned)
    step = torch.nn.Sequential(GatedMLP(gate_up, down), head)

    def unfused(x):
        gate, up = gate_up(x).chunk(2, dim=-1)
        return head(down(torch.nn.functional.silu(gate) * up))

    x = torch.randn(2, 3, HIDDEN, device=device, dtype=dtype)  # batch 2: torch.export specialises a batch of 1
    dims = ({0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=1, max=4096)},)
    cases = [(f"{batch}x{seq} rows", (torch.randn(batch, seq, HIDDEN, device=device, dtype=dtype),))
             for batch, seq in ((1, 1), (1, 3), (2, 32))]
    return package_check("softsyn gated int4 g32 gate/up (autotuned) + fp8 down + int4 g128 lm_head (configs pinned) "
                         "in an AOTInductor package (batch and seq dynamic), against the unfused eager layers", step,
                         (x,), dims, cases, unfused)


def softsyn_attention_packaged(device: str, dtype) -> str:
    """Whether AOTInductor packages softsyn's split attention (the attention form "softsyn") with batch, positions
    and span dynamic, as a decode package holds it, and the package gives the matmul form's result."""
    from softsyn.emit.torch_attention_forms import matmul_attention, softsyn_attention

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, m):
            return softsyn_attention(None, q, k, v, m, HEAD_DIM ** -0.5)[0]

    def inputs(batch, seq, span):
        positions = torch.arange(span - seq, span, device=device)[None].expand(batch, seq)
        mask = (torch.arange(span, device=device)[None, None, :] <= positions[:, :, None])[:, None]
        return (torch.randn(batch, HEADS, seq, HEAD_DIM, device=device, dtype=dtype),
                *torch.randn(2, batch, KV_HEADS, span, HEAD_DIM, device=device, dtype=dtype), mask)

    auto = torch.export.Dim.AUTO
    dims = ({0: auto, 2: auto}, {0: auto, 2: auto}, {0: auto, 2: auto}, {0: auto, 2: auto, 3: auto})
    cases = [(f"b{batch} seq {seq} span {span}", inputs(batch, seq, span))
             for batch, seq, span in ((1, 1, 512), (1, 1, 4096), (2, 5, 300))]
    return package_check("softsyn attention in an AOTInductor package (batch, positions, span dynamic), against the "
                         "matmul form", Attend(), inputs(2, 3, 700), dims, cases,
                         lambda *args: matmul_attention(None, *args, HEAD_DIM ** -0.5)[0])


def prologue_packaged(device: str, dtype) -> str:
    """bench/prologue_check.py's line: whether softsyn's attention prologue packages and writes the cache in place."""
    import prologue_check  # bench/

    return prologue_check.prologue_packaged(device, dtype)


GEMLITE_FORMS = (("A16W8 int8", 8, 0), ("A16W8 fp8", 8, -1), ("A16W4 g64", 4, 64), ("A16W4 g128", 4, 128))


def rtn_groups(weight: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W_q, scales, zeros) in the HQQ format gemlite packs, W ~ (W_q - zeros) * scales per group of `group` inputs:
    round-to-nearest between each group's min and max."""
    out, width = weight.shape
    w = weight.float().reshape(out, width // group, group)
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scales = ((high - low) / (2 ** bits - 1)).clamp(min=1e-8)
    zeros = -low / scales
    w_q = (w / scales + zeros).round().clamp(0, 2 ** bits - 1).to(torch.uint8).reshape(out, width)
    return w_q, scales.reshape(out, -1).to(weight.dtype), zeros.reshape(out, -1).to(weight.dtype)


def gemlite_layer(linear: torch.nn.Linear, bits: int, group: int):
    from gemlite.helper import A16W4_HQQ_INT, A16W8_FP8, A16W8_INT8

    device, dtype = linear.weight.device, linear.weight.dtype
    if bits == 8:
        return (A16W8_FP8 if group < 0 else A16W8_INT8)(device=device, dtype=dtype).from_linear(linear)
    return A16W4_HQQ_INT(device=device, dtype=dtype).from_weights(*rtn_groups(linear.weight.data, bits, group))


def gemlite_rows(device: str, dtype) -> list[tuple]:
    try:
        import gemlite
    except ImportError as exc:
        print(f"gemlite rows skipped: {exc} (docs/h200.md brings its wheel)", file=sys.stderr)
        return []
    config = Path(gemlite.__file__).parent / "configs" / "h100.json"  # H200 is H100's SM90: its cached tunings
    gemlite.load_config(str(config), print_error=False)
    rows = []
    for label, width_in, width_out in (("q/k/v packed", HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
                                       ("gate/up packed", HIDDEN, 2 * MLP), ("down", MLP, HIDDEN)):
        size = width_in * width_out * 2
        inp = torch.randn(1, width_in, device=device, dtype=dtype)
        for form, bits, group in GEMLITE_FORMS:
            linear = torch.nn.Linear(width_in, width_out, bias=False, device=device, dtype=dtype)
            torch.nn.init.normal_(linear.weight, std=0.02)
            want = linear(inp).float()
            try:
                layer = gemlite_layer(linear, bits, group)
                err = float((layer(inp).float() - want).abs().max() / want.abs().max())
                seconds = timed(lambda lyr=layer, i=inp: lyr(i), device)
            except Exception as exc:  # noqa: BLE001 - a form gemlite or Triton refuses here is a row, not a crash
                print(f"gemlite {form} {label}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                continue
            rows.append((f"{label} {width_in}x{width_out} (decode, {size / 1e6:.0f} MB at fp16)",
                         f"gemlite {form} (rel err {err:.1e})", seconds, size / seconds))
    return rows


def gemlite_packaged(device: str, dtype) -> str:
    """Whether AOTInductor packages (and then runs) a module holding a gemlite A16W4 layer: one line for the report."""
    import tempfile

    try:
        import gemlite  # noqa: F401 - the probe needs its custom op registered
    except ImportError as exc:
        return f"gemlite in an AOTInductor package: not probed ({exc})"
    linear = torch.nn.Linear(HIDDEN, HIDDEN, bias=False, device=device, dtype=dtype)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = gemlite_layer(linear, 4, 128)

        def forward(self, x):
            return self.proj(x) * 2

    x = torch.randn(1, HIDDEN, device=device, dtype=dtype)
    try:
        with torch.no_grad(), tempfile.TemporaryDirectory() as folder:
            program = torch.export.export(Step(), (x,), strict=False)
            path = torch._inductor.aoti_compile_and_package(program, package_path=f"{folder}/g.pt2")
            got = torch._inductor.aoti_load_package(path)(x)
            got = got[0] if isinstance(got, (list, tuple)) else got
            err = float((got.float() - Step()(x).float()).abs().max() / Step()(x).float().abs().max())
        return f"gemlite in an AOTInductor package: compiled and ran (rel err {err:.1e} against eager gemlite)"
    except Exception as exc:  # noqa: BLE001 - the answer is the failure
        return f"gemlite in an AOTInductor package: failed ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--parts", default="attention,projections,int4,softsyn,gemlite,chain",
                        help="which tables (comma-separated; default all; package: only whether softsyn's layers, "
                             "attention and attention prologue package under AOTInductor)")
    parser.add_argument("--span", type=int, default=768, help="the cache slots modulecompile's chains attend over")
    parser.add_argument("--ways", default="dynamic,static,AOTInductor",
                        help="how modulecompile compiles each chain (comma-separated subset)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    cuda = args.device == "cuda"  # tinygemm's int4 layout, softsyn's and gemlite's Triton kernels: CUDA only here
    # the package checks first, each printed as it ends: a call cut short by its limit still says whether they built
    checks = [check for check, wanted in ((softsyn_int4_packaged, {"softsyn", "package"}),
                                          (softsyn_attention_packaged, {"attention", "package"}),
                                          (prologue_packaged, {"prologue", "package"}),
                                          (gemlite_packaged, {"gemlite"})) if cuda and parts & wanted]
    packaged = []
    for check in checks:
        line = check(args.device, dtype)
        if line:
            print(line, flush=True)
            packaged.append(line)
    packaged += module_chain_lines(args.device, dtype) if cuda and "modulechain" in parts else []
    packaged += norm_chain_lines(args.device, dtype) if cuda and "normchain" in parts else []
    packaged += (module_compile_lines(args.device, dtype, args.span, tuple(args.ways.split(",")))
                 if cuda and "modulecompile" in parts else [])
    if cuda and "prompt" in parts:
        import prompt_check  # bench/: the prompt attention form packaged

        packaged += prompt_check.prompt_lines(args.device, dtype, timed)
    rows = attention_rows(args.device, dtype) if "attention" in parts else []
    rows += projection_rows(args.device, dtype) if "projections" in parts else []
    rows += int4_rows(args.device, dtype) if cuda and "int4" in parts else []
    rows += softsyn_int4_rows(args.device, dtype) if cuda and "softsyn" in parts else []
    rows += gemlite_rows(args.device, dtype) if cuda and "gemlite" in parts else []
    rows += chain_rows(args.device, dtype) if cuda and "chain" in parts else []
    rows += attention_chain_rows(args.device, dtype) if cuda and "attnchain" in parts else []
    if cuda and "layerchain" in parts:
        import layer_chain  # bench/: the step's GEMVs layer after layer

        rows += layer_chain.layer_chain_rows(args.device, dtype, timed)
    lines = [f"# h200-torch kernel choices on {name} (torch {torch.__version__}, {dtype})", "",
             "| what | form | us per call | effective GB/s (fp16 bytes of the weights or K/V / time) |", "|---|---|---:|---:|"]
    lines += [f"| {what} | {form} | {s * 1e6:.1f} | {bw / 1e9:.0f} |" for what, form, s, bw in rows]
    lines += ["", *packaged] if packaged else []
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
