"""Tensor parallelism, predicted against measured: softsyn's TP=1 -> TP=2 speed-up and per-device VRAM against
the same model run tensor-parallel by PyTorch on 2 H200s.

    python3 bench/tp_validate.py --dry-run                 # CPU: argument parsing and the prediction half only
    python3 bench/tp_validate.py -o bench/results/tp-validate-h200x2-DATE.md    # on a 2-GPU host (needs 2 GPUs)

Prediction (any machine): `softsyn analyze MODEL --tp 2` against the H200 library (h200-ort-cuda, collectives
h200-nccl, alpha-beta estimates until measured): per degree the prefill (TTFT) and decode (TPOT) critical
arrival of one device and its VRAM (weights + KV cache + workspace). `--dry-run` stops here and prints it;
it runs on a CPU-only machine (weightless export of the model's shapes).

Measurement (`--dry-run` off; a host with at least 2 GPUs, torch with NCCL, transformers): an HF folder of
the model's config with seeded random weights (softsyn.frontends.hf.write_seeded_folder, fp16) is written
under --work, then for each degree N in --degrees one `torchrun --nproc-per-node N` of this file in worker
mode: every rank loads the folder with `from_pretrained(tp_plan="auto")` (transformers' tensor-parallel plan
on DTensor over NCCL; N=1 loads it plainly on cuda:0), runs a prefill of --prompt-len tokens (TTFT: median
of --runs timed forwards, torch.cuda.synchronize around each, a barrier first) and, after a prefill of
--context-len tokens, --runs decode steps of one token (TPOT: median), and reports
torch.cuda.max_memory_allocated per rank. Rank 0 writes WORK/tp{N}.json; this process writes the markdown.

What is compared: the speed-up TP=1 -> TP=2 (the ratio, since softsyn predicts an ONNX Runtime CUDA
deployment and PyTorch eager runs other kernels) and the per-device memory (PyTorch's allocator peak holds the
weights, a dynamic KV cache and activations, close to softsyn's weights + KV + workspace).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen3-8b", help="zoo name of the real-size shape (default qwen3-8b)")
    ap.add_argument("--degrees", default="1,2", help="tensor-parallel degrees to measure (default 1,2)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--context-len", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--target", default="h200-ort-cuda")
    ap.add_argument("--work", default="/tmp/tp-validate", help="the seeded HF folder and the per-degree JSON")
    ap.add_argument("--dry-run", action="store_true", help="only the prediction (CPU), print it and exit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one torchrun rank
    ap.add_argument("-o", "--output", help="markdown result (default: print)")
    args = ap.parse_args(argv)
    args.degree_list = [int(d) for d in args.degrees.split(",")]
    if any(d < 1 for d in args.degree_list) or 1 not in args.degree_list:
        ap.error("--degrees must name positive degrees including 1 (the speed-up's base)")
    return args


def predict(args) -> dict:
    """softsyn's plan: per degree, prefill and decode arrival (s) and one device's VRAM (B)."""
    from softsyn.constraints import parse_constraints
    from softsyn.design import Design

    text = (f"target: {args.target}\nworkload: {{prompt_len: {args.prompt_len}, context_len: {args.context_len}}}\n"
            f"parallel: {{tensor: {max(args.degree_list)}, devices: {max(args.degree_list)}}}\n")
    path = Path(args.work) / "tp-validate.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    parse_constraints(text, str(path))
    analysis = Design.load(f"zoo:{args.model}", path, progress=False).analyze()
    rows = {r.n: {"prefill": r.arrival.get("prefill"), "decode": r.arrival.get("decode"), "total": r.total,
                  "weights": r.weights, "kv_cache": r.kv_cache, "workspace": r.workspace}
            for r in analysis.tp.rows if r.n in args.degree_list}
    return {"rows": rows, "layout": analysis.tp.layout, "collectives": analysis.tp.collectives}


def write_folder(args) -> Path:
    """The model's config with seeded random weights (the values softsyn materialises), fp16."""
    from softsyn.frontends import read_design
    from softsyn.frontends.hf import write_seeded_folder
    from softsyn.frontends.zoo import ZOO, make_config

    folder = Path(args.work) / f"{args.model}-seeded"
    if (folder / "config.json").exists():
        return folder
    entry = ZOO[args.model]
    meta = read_design(f"zoo:{args.model}", progress=False)
    tmp = folder.with_name(folder.name + ".tmp")
    write_seeded_folder(make_config(entry), meta.model, tmp, entry.dtype)
    tmp.rename(folder)
    return folder


def worker(args) -> None:
    """One rank: load the folder tensor-parallel, time prefill and decode, report memory (rank 0 writes)."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    folder = Path(args.work) / f"{args.model}-seeded"
    if world > 1:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16, tp_plan="auto")
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16).to("cuda")
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    sync = (lambda: (torch.cuda.synchronize(), dist.barrier())) if world > 1 else torch.cuda.synchronize

    def timed(fn) -> list[float]:
        out = []
        for _ in range(args.runs + 3):
            sync()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - start)
        return out[3:]

    prompt = torch.randint(0, vocab, (1, args.prompt_len), generator=gen).cuda()
    with torch.no_grad():
        ttft = timed(lambda: model(prompt, use_cache=True))
        context = torch.randint(0, vocab, (1, args.context_len), generator=gen).cuda()
        state = {"past": model(context, use_cache=True).past_key_values}
        token = torch.zeros((1, 1), dtype=torch.long, device="cuda")

        def step():
            state["past"] = model(token, past_key_values=state["past"], use_cache=True).past_key_values
        tpot = timed(step)
    peak = torch.cuda.max_memory_allocated()
    peaks = [peak]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, peak)
        peaks = gathered
    if rank == 0:
        result = {"n": world, "ttft": statistics.median(ttft), "tpot": statistics.median(tpot),
                  "ttft_p90": sorted(ttft)[int(0.9 * (len(ttft) - 1))], "tpot_p90": sorted(tpot)[int(0.9 * (len(tpot) - 1))],
                  "peak_memory": max(peaks), "device": torch.cuda.get_device_name(),
                  "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())) if world > 1 else None}
        (Path(args.work) / f"tp{world}.json").write_text(json.dumps(result, indent=1))
    if world > 1:
        dist.destroy_process_group()


def measure(args) -> dict:
    write_folder(args)
    results = {}
    for n in args.degree_list:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", __file__, "--worker",
               "--model", args.model, "--prompt-len", str(args.prompt_len), "--context-len", str(args.context_len),
               "--runs", str(args.runs), "--work", args.work]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)})
        results[n] = json.loads((Path(args.work) / f"tp{n}.json").read_text())
    return results


def markdown(args, predicted: dict, measured: dict | None) -> str:
    p = predicted["rows"]
    lines = [f"# Tensor parallelism on {args.model}: predicted vs measured ({datetime.date.today()})", "",
             f"`python3 bench/tp_validate.py --model {args.model} --degrees {args.degrees} --prompt-len "
             f"{args.prompt_len} --context-len {args.context_len} --runs {args.runs}`", "",
             f"softsyn: {args.target}, {predicted['layout']}; collectives {predicted['collectives']}.", "",
             "| TP | predicted TTFT | predicted TPOT | predicted VRAM/device | measured TTFT | measured TPOT | "
             "measured peak/device |", "|---|---|---|---|---|---|---|"]
    for n in args.degree_list:
        m = (measured or {}).get(n)
        lines.append(f"| {n} | {p[n]['prefill'] * 1e3:.3f} ms (est) | {p[n]['decode'] * 1e3:.3f} ms (est) | "
                     f"{p[n]['total'] / 1e9:.3f} GB | " + (f"{m['ttft'] * 1e3:.3f} ms | {m['tpot'] * 1e3:.3f} ms | "
                                                        f"{m['peak_memory'] / 1e9:.3f} GB |" if m else "- | - | - |"))
    lines.append("")
    for n in args.degree_list:
        if n == 1:
            continue
        sp = (p[1]["prefill"] / p[n]["prefill"], p[1]["decode"] / p[n]["decode"])
        line = f"- TP=1 -> TP={n} speed-up predicted: prefill {sp[0]:.2f}x, decode {sp[1]:.2f}x"
        if measured:
            ms = (measured[1]["ttft"] / measured[n]["ttft"], measured[1]["tpot"] / measured[n]["tpot"])
            line += f"; measured: prefill {ms[0]:.2f}x, decode {ms[1]:.2f}x"
        lines.append(line)
    if measured is None:
        lines += ["", "Dry run: nothing measured (prediction only)."]
    else:
        first = next(iter(measured.values()))
        lines += ["", f"Measured on {first['device']}, torch {first['torch']}, NCCL {first.get('nccl')}; medians of "
                  f"{args.runs} timed runs after 3 warm-ups; transformers tp_plan=\"auto\" (DTensor over NCCL)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse(argv)
    if args.worker:
        worker(args)
        return
    predicted = predict(args)
    measured = None if args.dry_run else measure(args)
    text = markdown(args, predicted, measured)
    if args.output:
        Path(args.output).write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
