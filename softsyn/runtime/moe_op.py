"""The SwiGLU attributes softsyn writes on every com.microsoft.MoE / QMoE node (the fused experts, the characterised
cells): transformers' SwiGLU, silu(gate) * up with gate/up interleaved per row, on every provider.

Each is explicit because the providers' defaults differ: ORT's CUDA kernel has defaulted to GPT-OSS's activation
(alpha 1.702, beta 1, swiglu_limit 7.0: onnxruntime's cuda/moe/moe_base.h), its CPU kernel to alpha 1, beta 0 and no
limit. (The fused qwen3-next prefill on ORT 1.31.1 CUDA departs from the CPU kernel by 43 % with or without the
explicit limit, H200 2026-12-03: that is another cause, see docs/decisions/2026-12-03-verify-locate.md.)
"""
MOE_SWIGLU = {"activation_type": "swiglu", "swiglu_fusion": 1, "activation_alpha": 1.0, "activation_beta": 0.0,
              "swiglu_limit": float("inf")}
