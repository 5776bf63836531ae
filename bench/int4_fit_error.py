"""Logits error of qwen3-1.7b (seeded weights, fp16-rounded, computed in fp32 on the CPU) with every projection and
the lm_head int4, quantised by the old min-to-max rule and by softsyn's least-squares fit (triton_weights.fit_int4),
at the groups of the h200-torch int4 compile's map (q/k/v, o, down g32; gate/up, lm_head g128): rel err (max|x -
ref| / max|ref|) and cosine of the last position's logits for three 513-token random prompts.
Usage: python bench/int4_fit_error.py  (~16 min on 2 cores, ~14 GB of memory)."""
import time, torch
from softsyn.frontends import source_torch_model
from softsyn.emit import triton_weights as tw
torch.set_num_threads(2)
t0 = time.time()
model = source_torch_model("zoo:qwen3-1.7b").eval()
model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone(), requires_grad=False)
model.to(torch.float16).to(torch.float32)  # the fp16 weights the target quantises, computed in fp32
print("built", round(time.time() - t0), flush=True)
linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
orig = {n: m.weight.detach().clone().half() for n, m in linears.items()}
def group(n): return 128 if ("gate_proj" in n or "up_proj" in n or n == "lm_head") else 32
def old(w, g):
    x = w.float().reshape(w.shape[0], -1, g); lo = x.amin(-1, keepdim=True).half().float()
    sc = ((x.amax(-1, keepdim=True) - lo) / 15).clamp(min=1e-8).half().float()
    return (((x - lo) / sc).round().clamp(0, 15) * sc + lo).reshape(w.shape)
def new(w, g):
    q = tw.quantise(w.float(), g, torch.float16)
    return tw.dequantise(q.packed, q.scales.float(), q.lows.float())
gen = torch.Generator().manual_seed(0)
prompts = [torch.randint(0, model.config.vocab_size, (1, 513), generator=gen) for _ in range(3)]
def logits():
    with torch.no_grad():
        return [model(input_ids=p).logits[0, -1].float() for p in prompts]
ref = logits(); print("ref", round(time.time() - t0), flush=True)
for name, rule in (("min-max", old), ("fit", new)):
    for n, m in linears.items():
        m.weight.data.copy_(rule(orig[n], group(n)))
    got = logits()
    errs = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, ref)]
    cos = [torch.nn.functional.cosine_similarity(a, b, dim=0).item() for a, b in zip(got, ref)]
    print(name, "rel err", [round(e, 4) for e in errs], "cos", [round(c, 4) for c in cos], round(time.time() - t0), flush=True)
