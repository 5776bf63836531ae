"""zoo:qwen3-next-tiny decoding with its hybrid cache: export time, tokens against transformers, verify, run, the Scan.

    python bench/qwen3_next_decode.py --work /tmp/qwen3-next-decode -o bench/results/qwen3-next-decode-DATE.md

Compiles zoo:qwen3-next-tiny for constraints/cpu-tiny.yaml with a fresh export cache (the export's time is in
compile.log), checks the greedy tokens of transformers, of the compiled artifact driven by softsyn's loop and of
onnxruntime-genai after a seeded prompt, runs `softsyn verify` and `softsyn run` at two prompt lengths, and times one
linear-attention layer's delta rule alone on ORT CPU, as the export's Scan (token by token) and as the compiled
model's com.microsoft.LinearAttention, beside the STA's figure for the latter.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import torch

ROOT = Path(__file__).resolve().parents[1]
NAME, PROMPT, GEN = "qwen3-next-tiny", 8, 32


def softsyn(*args, cache: Path) -> subprocess.CompletedProcess:
    """`softsyn ARGS` (compile and verify with the run's own export cache)."""
    extra = ["--cache-dir", str(cache)] if args[0] in ("compile", "verify") else []
    return subprocess.run([sys.executable, "-m", "softsyn.cli", *map(str, args), *extra], cwd=ROOT,
                          capture_output=True, text=True)


def tokens(out: Path) -> list[str]:
    """Greedy tokens of transformers, the compiled artifact (softsyn's loop) and onnxruntime-genai."""
    sys.path.insert(0, str(ROOT / "tests"))
    from genai_tokens import genai_tokens
    from softsyn.frontends import source_torch_model
    from softsyn.runtime.decoder import decoder_io
    from softsyn.runtime.generate import Generator, prompt_ids
    from softsyn.runtime.session import open_model

    prompt = prompt_ids(1024, PROMPT, seed=1)
    with torch.no_grad():
        model = source_torch_model(f"zoo:{NAME}", hybrid=True)
        hf = model.generate(torch.from_numpy(prompt)[None], max_new_tokens=GEN, min_new_tokens=GEN,
                            do_sample=False)[0, PROMPT:].tolist()
    path = out / "model.onnx"
    ours = list(Generator(open_model(path), decoder_io(ir.load(str(path)))).generate(prompt, GEN).tokens)
    genai = genai_tokens(out, prompt, GEN)
    return [f"- prompt: {PROMPT} token ids (`prompt_ids(1024, {PROMPT}, seed=1)`), {GEN} greedy tokens",
            f"- transformers {__import__('transformers').__version__} `generate`: {hf}",
            f"- compiled artifact, softsyn's loop (ORT {ort.__version__} CPU): "
            f"{'identical' if ours == hf else ours}",
            f"- onnxruntime-genai {__import__('onnxruntime_genai').__version__}: {'identical' if genai == hf else genai}"]


def scan_model(export: Path, part: Path):
    """Layer 0's Scan of the export (the delta rule before fusion) as a model of its own: its inputs and outputs as
    ports, the outer constants its body reads (the optimizer hoists them) as initializers."""
    model = onnx.load(str(export))
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    body = next(a.g for a in scan.attribute if a.name == "body")
    inner = {i.name for i in body.input} | {o for n in body.node for o in n.output}
    outer = {i for n in body.node for i in n.input if i and i not in inner}
    inits = [t for t in model.graph.initializer if t.name in outer]
    consts = [n for n in model.graph.node if n.op_type == "Constant" and n.output[0] in outer]
    infos = {v.name: v for v in (*model.graph.input, *model.graph.output, *model.graph.value_info)}
    graph = onnx.helper.make_graph([*consts, scan], "scan", [infos[n] for n in scan.input],
                                   [infos[n] for n in scan.output], inits)
    onnx.save(onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version), str(part))
    return [n for n in scan.input]


def linear_attention_model(compiled: Path, part: Path, dk: int, dv: int) -> None:
    """Layer 0's com.microsoft.LinearAttention of the compiled model as a model of its own (packed [1, T, H*D] ports)."""
    model = onnx.load(str(compiled), load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "LinearAttention")
    heads = next(a.i for a in node.attribute if a.name == "q_num_heads")
    node.input[:] = ["q", "k", "v", "state", "g", "beta"]
    node.output[:] = ["out", "state_out"]
    f = onnx.TensorProto.FLOAT
    ports = [onnx.helper.make_tensor_value_info(n, f, s) for n, s in (
        ("q", [1, "T", heads * dk]), ("k", [1, "T", heads * dk]), ("v", [1, "T", heads * dv]),
        ("state", [1, heads, dk, dv]), ("g", [1, "T", heads]), ("beta", [1, "T", heads]))]
    graph = onnx.helper.make_graph([node], "la", ports, [onnx.helper.make_tensor_value_info(n, f, None)
                                                          for n in ("out", "state_out")])
    onnx.save(onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version), str(part))


def _median_run(sess, feeds) -> float:
    for _ in range(3):
        sess.run(None, feeds)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def delta_rule_times(export: Path, out: Path, work: Path) -> list[str]:
    """Layer 0's delta rule alone on ORT CPU (1 thread, median of 20): the export's Scan, then the compiled model's
    LinearAttention, on seeded inputs (unit keys, decays below 1)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    state_name = scan_model(export, work / "scan.onnx")[0]
    scan = ort.InferenceSession(str(work / "scan.onnx"), so, providers=["CPUExecutionProvider"])
    linear_attention_model(out / "model.onnx", work / "la.onnx", *scan.get_inputs()[0].shape[2:])
    fused = ort.InferenceSession(str(work / "la.onnx"), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    lines = []
    for seq in (1, 16, 128, 256):
        feeds = {i.name: (rng.standard_normal([1, *i.shape[1:]] if i.name == state_name else [seq, 1, *i.shape[2:]])
                          * 0.1).astype(np.float32) for i in scan.get_inputs()}
        packed = {"state": feeds[state_name]}
        for name, i in zip(("q", "k", "v", "g", "beta"), scan.get_inputs()[1:]):
            x = feeds[i.name].transpose(1, 0, *range(2, feeds[i.name].ndim))
            packed[name] = np.ascontiguousarray(x.reshape(1, seq, -1))
        a, b = _median_run(scan, feeds), _median_run(fused, packed)
        lines.append(f"| {seq} | {a * 1e3:.3f} | {a / seq * 1e6:.2f} | {b * 1e3:.3f} | {b / seq * 1e6:.2f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/softsyn-qwen3-next-decode"))
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    out, cache = args.work / "out", args.work / "cache"
    load = open("/proc/loadavg").read().split()[:3]
    compiled = softsyn("compile", f"zoo:{NAME}", "-c", ROOT / "constraints" / "cpu-tiny.yaml", "-o", out, "-q",
                       cache=cache)
    lines = [f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average before: {' '.join(load)}",
             f"\n## softsyn compile (exit {compiled.returncode})\n", "```", (out / "compile.log").read_text().strip(),
             "```", "\n## Tokens\n", *tokens(out)]
    verified = softsyn("verify", out, cache=cache)
    lines += [f"\n## softsyn verify (exit {verified.returncode})\n", "```", verified.stdout.strip(), "```"]
    for prompt_len in (16, 128):
        ran = softsyn("run", out, "--prompt-len", prompt_len, "--gen", GEN, "--runs", 5, cache=cache)
        lines += [f"\n## softsyn run --prompt-len {prompt_len} --gen {GEN} --runs 5 (exit {ran.returncode})\n", "```",
                  ran.stdout.strip(), "```"]
    rpt = (out / "reports" / "timing_full.rpt").read_text().splitlines()
    sta = [f"{a.strip()} {b.strip()}" for a, b in zip(rpt, rpt[1:]) if "LinearAttention_" in a]
    export = next(cache.glob(f"{NAME}-*/model.onnx"))
    lines += ["\n## Layer 0's delta rule alone, ORT CPU, 1 thread: the export's Scan, the fused LinearAttention\n",
              "| tokens | Scan ms (median of 20) | Scan us/token | LinearAttention ms | LinearAttention us/token |",
              "|---|---|---|---|---|", *delta_rule_times(export, out, args.work),
              "\nThe STA's LinearAttention cells (reports/timing_full.rpt, prefill at 128 tokens then decode):\n", "```",
              *sta, "```"]
    args.output.write_text("\n".join(lines) + "\n")
    print(args.output.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
