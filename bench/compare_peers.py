"""Peers: a softsyn-compiled decoder against what else runs it on ONNX Runtime, side by side in one run.

    python bench/compare_peers.py                           # ORT CPU, zoo:qwen3-tiny: compiled, plain, ort_fusions
    python bench/compare_peers.py --provider cuda --model qwen3-1.7b \\
        --genai .whl/onnxruntime_genai-0.18.0-cp312-cp312-manylinux_2_28_x86_64.whl     # H200: + genai builder
    python bench/compare_peers.py --provider cuda --model gemma2-2b --genai WHEEL   # sliding window + soft caps
    python bench/compare_peers.py --model gemma2-tiny --variants compiled,plain,builder # the same offline, ORT CPU

Variants (same seeded inputs for all: softsyn.runtime.inputs.scenario_inputs, seed 0):
  compiled     `softsyn compile zoo:MODEL --effort low` for the target (cpu-ort | h200-ort-cuda), through
               softsyn.flow.compile.compile_design on the same netlist the plain variant comes from, run with the
               session options it emits (runtime/session.json)
  plain        the netlist's cached export (softsyn.runtime.measure.onnx_path: torch.onnx.export(dynamo=True))
  ort_fusions  plain + onnxscript.rewriter.ort_fusions.optimize_for_ort, saved to WORK/ort_fusions/
  builder      onnxruntime-genai's model builder (`python -m onnxruntime_genai.models.builder -i HF -o OUT
               -p fp16 -e cuda`; fp32/cpu with --provider cpu) on an HF folder holding the zoo config, the
               same seeded random weights softsyn exports (torch.manual_seed(0) + from_config in the zoo
               dtype) and a minimal WordLevel tokenizer; run in a subprocess in parallel with the export and
               time-boxed (--builder-timeout). Only the builder's pure-Python package is used: --genai takes
               the wheel (or an installed/unpacked onnxruntime_genai folder), whose models/ is copied under
               WORK/genai-shim next to an __init__.py that only sets __version__ (the real one loads the
               native library). Default variant with --provider cuda only.
  low          (with --compiled-dir) `softsyn compile --effort low` built in this run beside the artifact, so a
               compile loop's map is measured against the uniform design it started from in the same run
  torch        (with --torch-dir) a torch target's artifact `softsyn compile --target h200-torch` (or cpu-torch) wrote
               before: DIR/model.pt2 (AOTInductor) run by softsyn.runtime.torch_package.TorchStep, its fixed-shape
               steps replayed as CUDA graphs when runtime/torch.json says cuda_graphs (captured on the first warm-up
               run); its KV cache holds the scenario's past in its first positions, written in place; timed as the
               others, with torch.cuda.synchronize() inside each run (ORT's Run returns after its stream syncs)
  torch2       (with --torch2-dir) a second torch artifact of the same model, e.g. its int4 map beside the fp16 one
               of --torch-dir, timed in the same rounds
  X+graph      (compiled+graph, builder+graph; --provider cuda) variant X's model with the CUDA EP's
               enable_cuda_graph=1: one session per scenario (a graph replays fixed shapes and addresses), its
               binding made once; captured on the first warm-up run. A model ORT will not capture (a node
               outside the CUDA provider) is reported as failed with ORT's reason.

The builder's model has its own interface: input_ids, attention_mask, past_key_values.N.key/value, no
position_ids, and (genai_config.json search.past_present_share_buffer) a shared past/present KV buffer of
max_length positions: its past inputs are bound to buffers of --kv-buffer positions holding the same past
KV in the first `past` positions, and its present outputs are bound to those same buffers (genai's own
layout); every run writes the same slots, so a fixed binding is idempotent.

Method (shared/reference/h200.md; softsyn.runtime.measure's measured interval): one session per variant, per
scenario one IO binding made once (softsyn.runtime.binding.BoundRunner.from_feeds: inputs on the device, outputs
bound by name on the device and allocated by ORT), wall clock (perf_counter) around each run_with_iobinding call:
softsyn.runtime.measure.measure's interval, but with sessions and bindings kept across rounds (measure() opens a
session per call, which would rule out interleaving a 1.7B model).
Warm-up, then ROUNDS rounds; in each round, per scenario, every variant runs RUNS times, variants in a
rotating order (round-robin), so load from other processes hits all variants alike. Reported: median,
p10, p90 over all samples; `x compiled` = median / compiled's median; `paired` = median over rounds of
the per-round median ratio (robust to drift). Sanity: one run's outputs per variant and scenario against
the plain export's: max rel error = max|x - ref| / max|ref| for logits and for the present KV (the
builder's shared buffers compared on their first past+seq positions).

Kernels (--kernels, cuda): for the named scenarios, CUPTI's kernel records (torch.profiler, which sees every kernel of
the process, ORT's and those a CUDA graph replays) over 10 more runs per variant: kernels and device busy time per run
and the largest kernels by time, the per-kernel side-by-side that explains a gap between two variants.

A variant that fails (build, load, bind or run) prints its error and is left out; the others still report.
Results: bench/results/compare-peers-PROVIDER-DATE.md (command, versions, device, load, table, notes).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("compiled", "compiled+graph", "low", "low+graph", "torch", "torch2", "plain", "ort_fusions", "builder",
            "builder+graph")
TORCH_VARIANTS = ("torch", "torch2")  # a torch target's artifact each: --torch-dir, --torch2-dir
GRAPHED = "+graph"  # a variant of that name is its base variant's model run with the CUDA EP's enable_cuda_graph=1
LABELS = {
    "compiled": "softsyn compile --effort low",
    "compiled+graph": "the compiled model, CUDA graph (enable_cuda_graph=1, one session per scenario)",
    "low": "softsyn compile --effort low, compiled in this run (beside a --compiled-dir artifact)",
    "low+graph": "the --effort low model, CUDA graph (enable_cuda_graph=1, one session per scenario)",
    "builder+graph": "the builder's model, CUDA graph (enable_cuda_graph=1, one session per scenario)",
    "torch": "softsyn torch target artifact (AOTInductor model.pt2)",
    "torch2": "a second softsyn torch target artifact (another map of the same model, e.g. int4 beside fp16)",
    "plain": "plain export (torch.onnx dynamo)",
    "ort_fusions": "plain + onnxscript ort_fusions",
    "builder": "onnxruntime-genai 0.18 model builder",
}
PLANS = {
    "cpu": {"model": "qwen3-tiny", "target": "cpu-ort", "variants": ("compiled", "plain", "ort_fusions"),
            "builder": ("fp32", "cpu"), "rounds": 100, "runs": 20, "warmup": 20,
            "scenarios": {"decode128": {"batch": 1, "seq": 1, "past": 128},
                          "decode512": {"batch": 1, "seq": 1, "past": 512},
                          "prefill128": {"batch": 1, "seq": 128, "past": 0}}},
    "cuda": {"model": "qwen3-1.7b", "target": "h200-ort-cuda",
             # low: beside a --compiled-dir only; torch, torch2: with --torch-dir, --torch2-dir only
             "variants": tuple(v for v in VARIANTS if not v.startswith("low") and v not in TORCH_VARIANTS),
             "builder": ("fp16", "cuda"), "rounds": 20, "runs": 10, "warmup": 10,
             "scenarios": {"decode512": {"batch": 1, "seq": 1, "past": 512},
                           "decode4096": {"batch": 1, "seq": 1, "past": 4096},
                           "prefill512": {"batch": 1, "seq": 512, "past": 0}}},
}
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    head = text[0] if text else ""
    return f"{type(exc).__name__}: {head[:400]}"


@dataclass
class Variant:
    name: str
    path: Path | None = None
    options: dict | None = None  # SessionOptions attributes (softsyn.runtime.session.open_model)
    error: str = ""
    prep_seconds: float = 0.0
    nodes: int | None = None
    notes: list[str] = field(default_factory=list)
    genai_config: dict | None = None  # builder, and compiled (softsyn writes one for decoders)
    kv_buffer: int | None = None  # a shared past/present buffer's fixed length (compiled: kv_layout's max_length)

    @property
    def ok(self) -> bool:
        return self.path is not None and not self.error


# ---------------------------------------------------------------------------------------------------------
# builder: HF folder, genai shim, generation (a background thread running subprocesses)

def make_hf_folder(model: str, folder: Path) -> None:
    """The zoo config + the seeded weights softsyn materialises (softsyn.frontends.hf.write_seeded_folder: the
    same values, parameter by parameter) + a minimal WordLevel tokenizer, saved as a Hugging Face folder (what
    the genai builder reads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from softsyn.frontends import read_design, zoo
    from softsyn.frontends.export import torch_num_threads
    from softsyn.frontends.hf import write_seeded_folder

    entry = zoo.ZOO[model]
    cfg = zoo.make_config(entry)
    torch_num_threads()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if entry.weights == "meta":  # real size: the values filled into the weightless export the netlist comes from
        meta = read_design(f"zoo:{model}", progress=False)
        write_seeded_folder(cfg, meta.model, tmp, entry.dtype)
    else:  # tiny: built in torch, as softsyn.frontends.hf.load_transformers_design builds weights="random"
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, entry.dtype)).save_pretrained(str(tmp))
    vocab = {"<unk>": 0, "<|endoftext|>": 1, **{f"tok{i}": i for i in range(2, 256)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|endoftext|>",
                            eos_token="<|endoftext|>", pad_token="<|endoftext|>").save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def find_genai(spec: str | None) -> Path:
    """The genai source: a wheel, or a folder holding onnxruntime_genai/models/builder.py (or being it)."""
    candidates = [Path(spec).expanduser()] if spec else []
    if not spec:
        candidates += sorted((ROOT / ".whl").glob("onnxruntime_genai-*.whl"))
        found = importlib.util.find_spec("onnxruntime_genai")  # does not run its __init__
        if found is not None and found.submodule_search_locations:
            candidates += [Path(p) for p in found.submodule_search_locations]
    for c in candidates:
        if c.is_file() and c.suffix == ".whl":
            return c
        for pkg in (c / "onnxruntime_genai", c):
            if (pkg / "models" / "builder.py").is_file():
                return pkg
    raise FileNotFoundError("no onnxruntime-genai builder found: pass --genai WHEEL_OR_FOLDER "
                            f"(looked at: {', '.join(map(str, candidates)) or 'nothing'})")


def make_shim(source: Path, shim: Path) -> str:
    """WORK/genai-shim/onnxruntime_genai: the builder's pure-Python models/ + an __init__ that only sets
    __version__. Returns the version."""
    pkg = shim / "onnxruntime_genai"
    shutil.rmtree(shim, ignore_errors=True)
    pkg.mkdir(parents=True)
    if source.suffix == ".whl":
        m = re.match(r"onnxruntime_genai(?:_cuda)?-([^-]+)-", source.name)
        ver = m.group(1) if m else "unknown"
        with zipfile.ZipFile(source) as whl:
            for member in whl.namelist():
                if member.startswith("onnxruntime_genai/models/") and not member.endswith("/"):
                    whl.extract(member, shim)
    else:
        text = (source / "__init__.py").read_text() if (source / "__init__.py").is_file() else ""
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
        ver = m.group(1) if m else "unknown"
        shutil.copytree(source / "models", pkg / "models", ignore=shutil.ignore_patterns("__pycache__"))
    if not (pkg / "models" / "builder.py").is_file():
        raise FileNotFoundError(f"{source}: no onnxruntime_genai/models/builder.py in it")
    (pkg / "__init__.py").write_text(f'__version__ = "{ver}"  # shim: the builder only (no native library)\n')
    return ver


class BuilderJob(threading.Thread):
    """HF folder, then the genai builder, each a subprocess, within one deadline; runs beside the export."""

    def __init__(self, model: str, work: Path, genai: str | None, precision: str, ep: str, timeout: float,
                 extra: list[str] | None = None):
        super().__init__(daemon=True)
        self.model, self.work, self.genai, self.precision, self.ep = model, work, genai, precision, ep
        self.extra = extra or []
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.variant = Variant("builder")
        self.version = ""
        self.command = ""
        self.hf_seconds = 0.0

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"builder time box of {self.timeout:.0f} s spent (--builder-timeout)")
        return left

    def _run(self, cmd: list[str], logfile: Path, env: dict | None = None) -> None:
        with open(logfile, "w") as out:
            try:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.work,
                                      timeout=self.remaining())
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"`{' '.join(cmd[:4])} ...` passed the builder time box of {self.timeout:.0f} s "
                                   f"(--builder-timeout); log: {logfile}") from None
        if proc.returncode != 0:
            tail = [line for line in logfile.read_text(errors="replace").splitlines() if line.strip()][-3:]
            raise RuntimeError(f"exit {proc.returncode}: {' | '.join(tail)[-600:]} (log: {logfile})")

    def run(self) -> None:
        t0 = time.perf_counter()
        v = self.variant
        try:
            source = find_genai(self.genai)
            self.version = make_shim(source, self.work / "genai-shim")
            v.notes.append(f"builder from {source} (onnxruntime-genai {self.version}, pure-Python models/ only)")
            stamp = json.dumps({"model": self.model, "versions": _pkg_versions(("torch", "transformers"))},
                               sort_keys=True)
            hf = self.work / "hf"
            if not (hf / "stamp.json").is_file() or (hf / "stamp.json").read_text() != stamp:
                log(f"builder: writing the HF folder {hf} (seeded random weights)")
                t = time.perf_counter()
                self._run([sys.executable, str(Path(__file__).resolve()), "--make-hf-folder", str(hf),
                           "--model", self.model], self.work / "hf.log")
                (hf / "stamp.json").write_text(stamp)
                self.hf_seconds = time.perf_counter() - t
            out = self.work / "builder"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
                   "-p", self.precision, "-e", self.ep, "-c", str(self.work / "builder-cache")]
            if self.extra:
                cmd += ["--extra_options", *self.extra]
            self.command = " ".join(shlex.quote(c) for c in ["python"] + cmd[1:])
            env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
                       PYTHONPATH=os.pathsep.join([str(self.work / "genai-shim")]
                                                  + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
            log(f"builder: {self.command}")
            self._run(cmd, self.work / "builder.log", env)
            v.genai_config = json.loads((out / "genai_config.json").read_text())
            v.path = out / v.genai_config["model"]["decoder"]["filename"]
            if not v.path.is_file():
                raise FileNotFoundError(f"builder wrote no {v.path}")
        except Exception as exc:  # noqa: BLE001 - fail soft: report and go on
            v.error = short_error(exc)
        v.prep_seconds = time.perf_counter() - t0
        log(f"builder: {'failed: ' + v.error if v.error else 'done'} in {v.prep_seconds:.0f} s")


# ---------------------------------------------------------------------------------------------------------
# the other variants

def count_nodes(path: Path) -> int | None:
    try:
        import onnx

        return len(onnx.load(str(path), load_external_data=False).graph.node)
    except Exception:  # noqa: BLE001
        return None


def make_ort_fusions(plain: Path, out: Path) -> tuple[Path, dict]:
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = ir.load(str(plain))
    model, counts = optimize_for_ort(model)  # (model, config_name=None, *, debug, clear_metadata) in 0.7.2
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    path = out / "model.onnx"
    ir.save(model, str(path), external_data="model.onnx.data", size_threshold_bytes=1024)
    return path, {k: int(n) for k, n in counts.items() if n}


def use_compiled(directory: Path) -> tuple[Path, dict, str]:
    """An artifact `softsyn compile` wrote before (--compiled-dir): its model, session options and fusion coverage."""
    from softsyn.emit import SESSION_FILE

    session = json.loads((directory / SESSION_FILE).read_text())
    design = json.loads((directory / "design.json").read_text()) if (directory / "design.json").is_file() else {}
    fusion = directory / "reports" / "fusion.rpt"
    coverage = f"see {fusion}" if fusion.is_file() else ""
    what = ", ".join(f"{k} {design[k]}" for k in ("effort", "constraints") if design.get(k))
    return directory / session["model"], session.get("session_options") or {}, coverage + (f" ({what})" if what else "")


def make_compiled(netlist, target: str, out: Path, max_length: int) -> tuple[Path, dict, str]:
    """softsyn compile --effort low on `netlist` (modified in place: do it after everything else reads it)."""
    from softsyn.flow.compile import compile_design
    from softsyn.constraints import Constraints
    from softsyn.design import Design
    from softsyn.emit import SESSION_FILE, compiled_precision
    from softsyn.library import load_library
    from softsyn.runtime.measure import onnx_path

    cons = Constraints.default()
    cons.kv_cache.max_length = max_length  # kv_layout's shared buffer holds every timed context
    design = Design(netlist, cons, load_library(target), progress=True)
    reference = {"source": f"zoo:{netlist.name}", "onnx": str(onnx_path(netlist).resolve()),
                 "precision": compiled_precision(netlist)}
    _, path = compile_design(design, "low", out, reference)
    session = json.loads((path / SESSION_FILE).read_text())
    coverage = ", ".join(f"{c.kind} {c.fused}/{c.candidates}" for c in design.pass_reports.get("fuse", [])
                         if c.candidates)
    return path / session["model"], session.get("session_options") or {}, coverage


# ---------------------------------------------------------------------------------------------------------
# feeds, bindings, sanity

def variant_feeds(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The scenario feeds in the session's declared dtypes (fp16 ports get fp16 arrays)."""
    out = {}
    for i in sess.get_inputs():
        if i.name not in feeds:
            raise KeyError(f"the model wants input {i.name!r}, which the scenario does not provide "
                           f"(scenario inputs: {', '.join(feeds)})")
        want = ORT_DTYPES.get(i.type)
        out[i.name] = feeds[i.name].astype(want) if want is not None and feeds[i.name].dtype != want else feeds[i.name]
    return out


def builder_pairs(genai_config: dict) -> list[tuple[str, str]]:
    """(past input, present output) names per layer, from genai_config.json."""
    dec = genai_config["model"]["decoder"]
    ins, outs = dec["inputs"], dec["outputs"]
    pairs = []
    for layer in range(dec["num_hidden_layers"]):
        for past, present in (("past_key_names", "present_key_names"), ("past_value_names", "present_value_names")):
            pairs.append((ins[past] % layer, outs[present] % layer))
    return pairs


def bind(variant: Variant, sess, feeds: dict[str, np.ndarray], dims: dict[str, int], provider: str,
         kv_buffer: int):
    """A softsyn.runtime.binding.BoundRunner; for the builder with a shared KV buffer, past inputs and present outputs
    are re-bound to one buffer of kv_buffer positions per tensor (the first `past` positions = the feed)."""
    import onnxruntime as ort

    from softsyn.runtime.binding import BoundRunner

    cfg = variant.genai_config
    shared = bool(cfg and cfg.get("search", {}).get("past_present_share_buffer"))
    if not shared:
        return BoundRunner.from_feeds(sess, variant_feeds(sess, feeds), provider), {}
    pairs = builder_pairs(cfg)
    past_names = {p for p, _ in pairs}
    total = dims["past"] + dims["seq"]
    if kv_buffer < total:
        raise ValueError(f"--kv-buffer {kv_buffer} < past + seq = {total}")
    types = {i.name: i for i in sess.get_inputs()}
    plain = {k: v for k, v in feeds.items() if k not in past_names}
    runner = BoundRunner.from_feeds(sess, variant_feeds(_Inputs(sess, exclude=past_names), plain), provider)
    dec = cfg["model"]["decoder"]
    device = "cuda" if provider == "cuda" else "cpu"
    present_of = {}
    for past, present in pairs:
        if past not in types:
            raise KeyError(f"genai_config names input {past!r}, which the model lacks")
        dtype = ORT_DTYPES[types[past].type]
        buf = np.zeros((dims["batch"], dec["num_key_value_heads"], kv_buffer, dec["head_size"]), dtype)
        if past in feeds and dims["past"]:
            buf[:, :, : dims["past"]] = feeds[past]
        value = ort.OrtValue.ortvalue_from_numpy(buf, device, 0)
        runner.keep.append(value)
        runner.binding.bind_ortvalue_input(past, value)
        runner.binding.bind_ortvalue_output(present, value)  # replaces the by-name binding: shared buffer
        present_of[present] = total
    return runner, present_of


class _Inputs:
    """A session view whose get_inputs() leaves some names out (for variant_feeds)."""

    def __init__(self, sess, exclude: set[str]):
        self._sess, self._exclude = sess, exclude

    def get_inputs(self):
        return [i for i in self._sess.get_inputs() if i.name not in self._exclude]


class TorchRunner:
    """A torch artifact's step at one scenario, shaped like a BoundRunner: run() is one step (waiting for the device);
    outputs() the logits and the cache's filled positions as present.N.key/value, on the host in fp32."""

    def __init__(self, step, feeds: dict[str, np.ndarray], dims: dict[str, int]):
        layers = step.cache["layers"]
        past = [feeds[f"past_key_values.{i}.{k}"] for i in range(layers) for k in ("key", "value")] if dims["past"] else []
        self.step, self.ids, self.start, self.layers = step, feeds["input_ids"], dims["past"], layers
        self.cache = step.empty_cache(dims["batch"], past)
        self.filled = dims["past"] + dims["seq"]
        self.logits = None

    def run(self) -> None:
        self.logits = self.step(self.ids, self.start, self.cache)
        self.step.sync()

    def outputs(self) -> dict[str, np.ndarray]:
        out = {"logits": self.logits.float().cpu().numpy()}
        out.update({f"present.{i}.{k}": self.cache[2 * i + j][:, :, :self.filled].float().cpu().numpy()
                    for i in range(self.layers) for j, k in enumerate(("key", "value"))})
        return out


def fetch(runner, sess) -> dict[str, np.ndarray]:
    """One run's outputs on the host (binding order = the session's output order, also after re-binding)."""
    if isinstance(runner, TorchRunner):
        runner.run()
        return runner.outputs()
    runner.run()
    values = runner.binding.copy_outputs_to_cpu()
    return {o.name: np.asarray(v) for o, v in zip(sess.get_outputs(), values)}


def rel_error(x: np.ndarray, ref: np.ndarray) -> float:
    x, ref = x.astype(np.float32), ref.astype(np.float32)  # fp32 is exact enough; 1.7B prefill logits are 78 M
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))


def compare(outs: dict, ref: dict, lengths: dict) -> tuple[float | None, float | None]:
    """max rel error of logits and of the present KV against the reference outputs (None: not comparable)."""
    x, r = outs.get("logits"), ref.get("logits")
    if x is not None and r is not None and x.ndim == 3 and x.shape[1] == 1 < r.shape[1]:
        r = r[:, -1:]  # last-position logits (softsyn's kv_layout) against the reference's last row
    logits = rel_error(x, r) if x is not None and r is not None and x.shape == r.shape else None
    kv = []
    for name, r in ref.items():
        if not name.startswith("present") or name not in outs:
            continue
        x = outs[name]
        if name in lengths:
            x = x[:, :, : lengths[name]]
        if x.shape == r.shape:
            kv.append(rel_error(x, r))
    return logits, (max(kv) if kv else None)


# ---------------------------------------------------------------------------------------------------------

def _pkg_versions(names) -> dict:
    out = {}
    for pkg in names:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def versions_line(genai: str) -> str:
    import onnxruntime

    import softsyn

    found = _pkg_versions(("torch", "transformers", "onnx", "onnxscript", "onnx-ir", "numpy"))
    parts = [f"softsyn {softsyn.__version__}",
             f"onnxruntime {onnxruntime.__version__} ({onnxruntime.get_device()} build, "
             f"{Path(onnxruntime.__file__).parent.parent})"]
    parts += [f"{k} {v}" for k, v in found.items()]
    if genai:
        parts.append(f"onnxruntime-genai builder {genai}")
    return ", ".join(parts) + f"; Python {platform.python_version()}"


def stats(samples: list[float]) -> dict:
    ordered = sorted(samples)
    q = lambda f: ordered[min(len(ordered) - 1, int(f * len(ordered)))]  # noqa: E731 - softsyn.runtime.measure's quantile
    return {"median": statistics.median(ordered), "p10": q(0.1), "p90": q(0.9), "n": len(ordered)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu",
                        help="the plan: cpu = qwen3-tiny on ORT CPU (target cpu-ort); cuda = H200 plan "
                             "(target h200-ort-cuda, fp16, + the genai builder)")
    parser.add_argument("--model", help="zoo decoder (default: qwen3-tiny for cpu, qwen3-1.7b for cuda)")
    parser.add_argument("--variants", help=f"comma-separated subset of {','.join(VARIANTS)} "
                                           "(default: cpu compiled,plain,ort_fusions; cuda all four)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default cpu 100, cuda 20)")
    parser.add_argument("--runs", type=int, help="timed runs per variant per scenario per round (default cpu 20, cuda 10)")
    parser.add_argument("--warmup", type=int, help="warm-up runs per variant per scenario (default cpu 20, cuda 10)")
    parser.add_argument("--genai", help="onnxruntime-genai wheel or folder for the builder (default: .whl/"
                                        "onnxruntime_genai-*.whl, else an installed onnxruntime_genai)")
    parser.add_argument("--builder-precision", choices=["fp32", "fp16", "int4"],
                        help="the builder's -p (default fp16 on cuda, fp32 on cpu); int4 is its MatMulNBits model")
    parser.add_argument("--compiled-dir", type=Path, metavar="DIR",
                        help="measure this softsyn artifact (compiled before from the same zoo model, e.g. --effort "
                             "ultra under a constraints file) as the compiled variant instead of compiling --effort low")
    parser.add_argument("--torch-dir", type=Path, metavar="DIR",
                        help="a torch target's artifact (softsyn compile --target h200-torch): adds variant torch")
    parser.add_argument("--torch2-dir", type=Path, metavar="DIR",
                        help="a second torch artifact of the same model (e.g. its int4 map): adds variant torch2")
    parser.add_argument("--builder-timeout", type=float, default=420.0,
                        help="time box of HF folder + builder generation, s (runs beside the export; default 420)")
    parser.add_argument("--builder-options", nargs="+", metavar="KEY=VALUE",
                        help="passed to the builder as --extra_options (e.g. enable_cuda_graph=1); default none")
    parser.add_argument("--prepare-only", action="store_true",
                        help="build the variants and stop: no sessions, no timing, no results file")
    parser.add_argument("--kv-buffer", type=int, default=4160,
                        help="builder's shared past/present buffer length, positions (default 4160: decode at 4096 fits)")
    parser.add_argument("--scenarios", help="comma-separated subset of the provider's scenarios (default: all)")
    parser.add_argument("--kernels", default="decode512,decode4096",
                        help="cuda: scenarios whose kernels CUPTI records per variant (torch.profiler), "
                             "printed as a per-kernel table; '' = none (default decode512,decode4096)")
    parser.add_argument("--measure-on", choices=["cpu", "cuda"],
                        help="run the sessions on this provider instead of --provider's (testing the cuda plan "
                             "on a machine without a GPU)")
    parser.add_argument("--work", type=Path, help="build folder (default $TMPDIR/softsyn-peers-PROVIDER-MODEL)")
    parser.add_argument("--cache-dir", help="softsyn export cache (default $SOFTSYN_CACHE or ~/.cache/softsyn)")
    parser.add_argument("-o", "--output", type=Path,
                        help="results file (default bench/results/compare-peers-PROVIDER-DATE.md); '-' = none")
    parser.add_argument("--peers-json", type=Path, metavar="FILE",
                        help="also write the variants as peers.json for `softsyn report pareto DIR --peers FILE`: per "
                             "variant its median per path group (the first decode and prefill scenario) and its worst "
                             "logits rel error against the plain export")
    parser.add_argument("--make-hf-folder", type=Path, metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()

    plan = PLANS[args.provider]
    model = args.model or plan["model"]
    if args.make_hf_folder:  # internal: the builder job's first subprocess
        make_hf_folder(model, args.make_hf_folder)
        return 0
    variants = [v.strip() for v in (args.variants.split(",") if args.variants else plan["variants"]) if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        parser.error(f"unknown variant {', '.join(bad)}; valid: {', '.join(VARIANTS)}")
    if any(v.removesuffix(GRAPHED) == "low" for v in variants) and not args.compiled_dir:
        parser.error("variant low is the --effort low build beside a --compiled-dir artifact: without --compiled-dir "
                     "the compiled variant is that build")
    torch_dirs = {name: folder for name, folder in zip(TORCH_VARIANTS, (args.torch_dir, args.torch2_dir))}
    for name, folder in torch_dirs.items():
        if folder and name not in variants:
            variants.append(name)
        if name in variants and not folder:
            parser.error(f"variant {name} is the artifact of --{name}-dir DIR (softsyn compile --target h200-torch)")
    # a graph variant runs its base variant's model: build the base too
    wanted = set(variants) | {v.removesuffix(GRAPHED) for v in variants if v.endswith(GRAPHED)}
    variants = [v for v in VARIANTS if v in wanted]
    rounds, runs, warmup = (args.rounds or plan["rounds"], args.runs or plan["runs"], args.warmup or plan["warmup"])
    provider = args.measure_on or args.provider
    scenarios = plan["scenarios"]
    if args.scenarios:  # a subset, e.g. the ones a sliding-window cache of --kv-buffer positions can hold
        unknown = [n for n in args.scenarios.split(",") if n not in scenarios]
        if unknown:
            parser.error(f"unknown scenario {', '.join(unknown)}; valid: {', '.join(scenarios)}")
        scenarios = {n: scenarios[n] for n in args.scenarios.split(",")}
    work = args.work or Path(tempfile.gettempdir()) / f"softsyn-peers-{args.provider}-{model}"
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    started = datetime.datetime.now().astimezone()
    t_start = time.perf_counter()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    load0 = os.getloadavg()
    from softsyn.runtime.inputs import scenario_inputs
    from softsyn.runtime.measure import onnx_path
    from softsyn.runtime.session import device_name, open_model

    found: dict[str, Variant] = {name: Variant(name) for name in variants}
    job = None
    if "builder" in variants:
        precision, ep = plan["builder"]
        precision = args.builder_precision or precision
        LABELS["builder"] = f"{LABELS['builder']}, -p {precision}"
        job = BuilderJob(model, work, args.genai, precision, ep, args.builder_timeout, args.builder_options)
        job.start()

    # one export for compiled, plain and ort_fusions (materialised: real-size zoo models get seeded fp16 weights)
    from softsyn.frontends import read_design

    t = time.perf_counter()
    netlist = None
    try:
        netlist = read_design(f"zoo:{model}", cache_dir=args.cache_dir, progress=True, materialize=True)
        plain = onnx_path(netlist)
        feeds = {name: scenario_inputs(netlist, dims, seed=0) for name, dims in scenarios.items()}
        ports = [(v.name, str(v.dtype)) for v in netlist.model.graph.inputs]
    except Exception as exc:  # noqa: BLE001 - nothing runs without the export
        print(f"export of zoo:{model} failed: {short_error(exc)}", file=sys.stderr)
        traceback.print_exc()
        return 2
    export_s = time.perf_counter() - t
    log(f"export: {plain} ({'cache hit' if netlist.provenance.get('cache', {}).get('hit') else 'exported'}, "
        f"{export_s:.0f} s)")

    if "plain" in found:
        found["plain"].path = plain
    if "ort_fusions" in found:
        v, t = found["ort_fusions"], time.perf_counter()
        try:
            v.path, counts = make_ort_fusions(plain, work / "ort_fusions")
            v.notes.append("optimize_for_ort fusions: " + (", ".join(f"{k} {n}" for k, n in counts.items()) or "none"))
        except Exception as exc:  # noqa: BLE001
            v.error = short_error(exc)
        v.prep_seconds = time.perf_counter() - t
        log(f"ort_fusions: {'failed: ' + v.error if v.error else 'done'} in {v.prep_seconds:.0f} s")
    # the artifact first: --effort low (make_compiled) rewrites the netlist in place
    for name in ("compiled", "low"):
        if name not in found:
            continue
        v, t = found[name], time.perf_counter()
        try:
            if name == "compiled" and args.compiled_dir:
                v.path, v.options, coverage = use_compiled(args.compiled_dir)
                LABELS["compiled"] = f"softsyn artifact {args.compiled_dir}, compiled before this run"
            else:
                v.path, v.options, coverage = make_compiled(netlist, plan["target"], work / name, args.kv_buffer)
            genai = v.path.parent / "genai_config.json"
            if genai.exists():
                v.genai_config = json.loads(genai.read_text())
                v.kv_buffer = v.genai_config.get("search", {}).get("max_length")
            v.notes.append(f"target {plan['target']}; fusion coverage: {coverage or 'none'}")
            compiled_ports = [(p.name, str(p.dtype)) for p in netlist.model.graph.inputs]
            if [n for n, _ in compiled_ports] != [n for n, _ in ports]:
                v.notes.append(f"input ports differ from the plain export: {[n for n, _ in compiled_ports]}")
            elif compiled_ports != ports:
                v.notes.append("same input ports as the plain export; dtypes " + ", ".join(
                    sorted({f"{n} {d}" for (n, d), (_, d0) in zip(compiled_ports, ports) if d != d0})[:3]) + " ...")
            else:
                v.notes.append("same input ports (names and dtypes) as the plain export")
        except Exception as exc:  # noqa: BLE001
            v.error = short_error(exc)
            traceback.print_exc()
        v.prep_seconds = time.perf_counter() - t
        log(f"{name}: {'failed: ' + v.error if v.error else 'done'} in {v.prep_seconds:.0f} s")
    for name in (n for n in TORCH_VARIANTS if n in found):
        v, folder = found[name], torch_dirs[name]
        try:
            from softsyn.runtime.torch_package import SPAN_STEP, package_label, read_torch_settings

            settings = read_torch_settings(folder)
            v.path = folder / settings["package"]
            v.notes.append(f"packages {package_label(settings)} (softsyn's runner picks by the step's seq)")
            weights = sorted({w["precision"] for w in settings.get("weights", {}).values()})
            LABELS[name] = (f"softsyn {settings['target']} artifact {folder} ({settings['dtype']}"
                            + (f", {'/'.join(weights)} weights" if weights else "")
                            + f"{', CUDA graphs' if settings.get('cuda_graphs') else ''}), compiled before this run")
            v.notes.append(f"static KV cache of {settings['kv_cache']['max_length']} positions, attention over the "
                           f"filled prefix rounded up to {SPAN_STEP} slots; see its reports/torch.rpt")
        except Exception as exc:  # noqa: BLE001
            v.error = short_error(exc)
    if job is not None:
        job.join(max(0.0, job.deadline - time.monotonic()) + 5)
        if job.is_alive():
            job.variant.error = job.variant.error or "builder still running at its time box"
        found["builder"] = job.variant
        if job.command:
            job.variant.notes.insert(0, f"generated by `{job.command}`"
                                     + (f" (HF folder {job.hf_seconds:.0f} s)" if job.hf_seconds else ""))
    for name, v in found.items():
        base = found.get(name.removesuffix(GRAPHED)) if name.endswith(GRAPHED) else None
        if base is not None:
            v.path, v.options, v.genai_config, v.error = base.path, base.options, base.genai_config, base.error
            v.kv_buffer = base.kv_buffer
            v.notes = [f"the {base.name} model, enable_cuda_graph=1 (captured on its first run per scenario)"]
        if v.ok:
            v.nodes = count_nodes(v.path)
        log(f"{v.name}: " + (f"FAILED: {v.error}" if v.error else f"{v.path}, {v.nodes} nodes, {v.prep_seconds:.0f} s; "
                             + "; ".join(v.notes)))
    if args.prepare_only:
        log(f"prepared in {time.perf_counter() - t_start:.0f} s (--prepare-only: no timing)")
        return 1 if any(v.error for v in found.values()) else 0

    # sessions and bindings (one session per variant, one binding per scenario)
    runners: dict[str, dict[str, object]] = {}
    sessions = {}
    kv_lengths: dict[str, dict[str, dict]] = {}
    for name, v in found.items():
        if not v.ok:
            continue
        t = time.perf_counter()
        try:
            if name in TORCH_VARIANTS:
                from softsyn.runtime.torch_package import TorchStep, read_torch_settings

                step = TorchStep(torch_dirs[name], read_torch_settings(torch_dirs[name]))
                sessions[name] = {scen: None for scen in scenarios}
                runners[name] = {scen: TorchRunner(step, feeds[scen], dims) for scen, dims in scenarios.items()}
                kv_lengths[name] = {scen: {} for scen in scenarios}
                log(f"session {name}: {step.device}, {step.dtype} ({time.perf_counter() - t:.0f} s)")
                continue
            graphed = name.endswith(GRAPHED)
            sess = None if graphed else open_model(v.path, provider, options=v.options)
            sessions[name], runners[name], kv_lengths[name] = {}, {}, {}
            for scen, dims in scenarios.items():
                # a CUDA graph replays fixed shapes and addresses: one session per scenario, its binding made once
                s = open_model(v.path, provider, options=v.options, cuda_graph=True) if graphed else sess
                sessions[name][scen] = s
                runners[name][scen], kv_lengths[name][scen] = bind(v, s, feeds[scen], dims, provider,
                                                                   v.kv_buffer or args.kv_buffer)
            if v.genai_config and v.genai_config.get("search", {}).get("past_present_share_buffer"):
                v.notes.append(f"shared past/present KV buffers of {v.kv_buffer or args.kv_buffer} positions, "
                               f"inputs {', '.join(i.name for i in s.get_inputs()[:2])}, past_key_values.N.*")
        except Exception as exc:  # noqa: BLE001
            v.error = short_error(exc)
            runners.pop(name, None)
            sessions.pop(name, None)
        log(f"session {name}: {'failed: ' + v.error if v.error else provider} "
            f"({time.perf_counter() - t:.0f} s)")

    # warm-up and sanity outputs
    sanity: dict[str, dict[str, tuple]] = {}
    reference: dict[str, dict] = {}
    for name in list(runners):
        try:
            for scen in scenarios:
                for _ in range(max(1, warmup)):
                    runners[name][scen].run()
                outs = fetch(runners[name][scen], sessions[name][scen])
                if name == "plain":
                    reference[scen] = outs
                else:
                    sanity.setdefault(name, {})[scen] = outs
        except Exception as exc:  # noqa: BLE001
            found[name].error = "run: " + short_error(exc)
            runners.pop(name)
            log(f"{name}: {found[name].error}")
    errors: dict[str, dict[str, tuple]] = {}
    for name, per in sanity.items():
        errors[name] = {scen: compare(outs, reference[scen], kv_lengths[name][scen]) if scen in reference else
                        (None, None) for scen, outs in per.items()}
    sanity.clear()

    # interleaved timing
    active = [n for n in VARIANTS if n in runners]
    samples = {n: {s: [] for s in scenarios} for n in active}
    per_round = {n: {s: [] for s in scenarios} for n in active}
    log(f"timing {', '.join(active)}: {rounds} rounds x {runs} runs per variant and scenario, round-robin")
    for r in range(rounds):
        for scen in scenarios:
            order = active[r % len(active):] + active[: r % len(active)] if active else []
            for name in order:
                if name not in runners:
                    continue
                runner = runners[name][scen]
                times = []
                try:
                    for _ in range(runs):
                        t0 = time.perf_counter()
                        runner.run()
                        times.append(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001
                    found[name].error = f"run (round {r}): " + short_error(exc)
                    runners.pop(name)
                    log(f"{name}: {found[name].error}")
                    continue
                samples[name][scen] += times
                per_round[name][scen].append(statistics.median(times))
    kernel_lines = []
    if provider == "cuda" and args.kernels:
        for scen in [k for k in args.kernels.split(",") if k in scenarios]:
            kernel_lines += kernel_table(scen, {n: runners[n][scen] for n in active if n in runners})
    load1 = os.getloadavg()
    wall = time.perf_counter() - t_start

    # report
    rows = []
    for scen, dims in scenarios.items():
        base = stats(samples["compiled"][scen]) if "compiled" in runners else None
        for name in VARIANTS:
            if name not in found:
                continue
            v = found[name]
            row = {"scenario": scen, "dims": dims, "variant": name, "nodes": v.nodes, "error": v.error}
            if name in runners and samples[name][scen]:
                row.update(stats(samples[name][scen]))
                if base:
                    row["ratio"] = row["median"] / base["median"]
                    pr = [a / b for a, b in zip(per_round[name][scen], per_round["compiled"][scen])]
                    row["paired"] = statistics.median(pr) if pr else None
                row["err"] = (None, None) if name == "plain" else errors.get(name, {}).get(scen, (None, None))
            rows.append(row)
    table = render_table(rows)
    device = device_name(provider)
    genai_ver = job.version if job else ""
    head = [f"# Peers, {args.provider}: softsyn-compiled zoo:{model} vs plain export, ort_fusions"
            + (", onnxruntime-genai builder" if "builder" in variants else ""), "",
            f"- date: {started.isoformat(timespec='seconds')}",
            f"- command: `{command}`",
            f"- device: {device}; sessions on {'CUDAExecutionProvider' if provider == 'cuda' else 'CPUExecutionProvider'}"
            + (f" (--measure-on {provider}: a test of the {args.provider} plan, not its numbers)"
               if args.measure_on and args.measure_on != args.provider else ""),
            f"- versions: {versions_line(genai_ver)}",
            f"- model: zoo:{model}, seeded random weights (seed 0), "
            f"{netlist.provenance.get('dtype', '?')} export; scenario inputs "
            "softsyn.runtime.inputs.scenario_inputs(seed 0)",
            f"- method: one session per variant (default SessionOptions; compiled: its runtime/session.json), IO binding "
            f"made once per scenario (inputs on the device, outputs bound on the device), wall clock around "
            f"run_with_iobinding; {warmup} warm-up runs, then {rounds} rounds x {runs} runs per variant per scenario, "
            f"variants round-robin in a rotating order; {rounds * runs} samples per cell",
            "- median / p10 / p90 over all samples; x compiled = median / compiled's median (> 1: slower than "
            "compiled); paired = median over rounds of the round's median ratio",
            "- rel err: max|x - ref| / max|ref| of one run's logits and present KV against the plain export "
            "(the reference); builder KV compared on its shared buffer's first past + seq positions",
            f"- load average: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} at start, {load1[0]:.2f} {load1[1]:.2f} "
            f"{load1[2]:.2f} at end, on {os.cpu_count()} cores"
            + (" (shared machine: timings are noisy; compare the ratios, re-run on a quiet machine)"
               if max(load0[0], load1[0]) > 0.5 * (os.cpu_count() or 1) else ""),
            f"- wall time {wall:.0f} s (export {export_s:.0f} s"
            + "".join(f", {n} {found[n].prep_seconds:.0f} s" for n in found if found[n].prep_seconds) + ")"]
    notes = ["", "Variants:"]
    for name, v in found.items():
        where = f"`{v.path}`" if v.path else "—"
        notes.append(f"- **{name}** ({LABELS[name]}): {where}" + (f"; {v.nodes} nodes" if v.nodes else "")
                     + "".join(f"; {n}" for n in v.notes) + (f"; **FAILED**: {v.error}" if v.error else ""))
    text = "\n".join(head + [""] + table + notes + kernel_lines) + "\n"
    print(text)
    if args.peers_json:
        data = peers_json(rows, scenarios, f"zoo:{model} on {device}, {started.date()}")
        args.peers_json.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
        log(f"wrote {args.peers_json} ({len(data['peers'])} peers)")
    if str(args.output) != "-":
        output = args.output or ROOT / "bench" / "results" / f"compare-peers-{args.provider}-{started.date()}.md"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        log(f"wrote {output}")
    return 1 if any(v.error for v in found.values()) else 0


def peers_json(rows: list[dict], scenarios: dict, where: str) -> dict:
    """peers.json (softsyn.results.pareto.peer_points reads it): per timed variant its median per path group, a
    group standing for the first scenario of its kind (seq 1: decode, else prefill), and its worst logits rel error
    over those scenarios against the plain export (the reference: 0 for plain itself; null where none compared)."""
    groups: dict[str, str] = {}
    for name, dims in scenarios.items():
        groups.setdefault("decode" if dims["seq"] == 1 else "prefill", name)
    peers = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        by = {r["scenario"]: r for r in rows if r["variant"] == variant and "median" in r}
        latency = {g: by[s]["median"] for g, s in groups.items() if s in by}
        if not latency:
            continue
        errs = [by[s].get("err", (None, None))[0] for s in groups.values() if s in by]
        errs = [e for e in errs if e is not None]
        error = 0.0 if variant == "plain" else (max(errs) if errs else None)
        peers.append({"label": f"{variant}: {LABELS[variant]}"[:120], "latency": latency, "error": error})
    shown = ", ".join(f"{g} = {s} (b{scenarios[s]['batch']} s{scenarios[s]['seq']} p{scenarios[s]['past']})"
                      for g, s in groups.items())
    return {"schema": "softsyn.peers/1", "peers": peers,
            "what": f"bench/compare_peers.py, {where}: {shown}; median latency; error: worst logits max rel error "
                    "against the plain export"}


KERNEL_RUNS = 10  # profiled runs per variant and scenario


def kernel_profile(runner) -> dict:
    """CUPTI's kernel records over KERNEL_RUNS runs of one bound runner (torch.profiler sees every kernel of the
    process, ORT's and those a CUDA graph replays): kernels and busy time per run, time and count per kernel name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    runner.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(KERNEL_RUNS):
            runner.run()
        torch.cuda.synchronize()
    trace = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text()).get("traceEvents", []) if e.get("cat") == "kernel"]
    by_name: dict[str, list] = {}
    for e in events:
        entry = by_name.setdefault(kernel_label(e["name"]), [0, 0.0])
        entry[0] += 1
        entry[1] += e["dur"] * 1e-6
    return {"kernels": len(events) / KERNEL_RUNS, "busy": sum(e["dur"] for e in events) * 1e-6 / KERNEL_RUNS,
            "by_name": {k: (n / KERNEL_RUNS, t / KERNEL_RUNS) for k, (n, t) in by_name.items()}}


def kernel_label(name: str) -> str:
    """A kernel's name without template arguments and return type, short enough for a table cell."""
    name = re.sub(r"<.*", "", name.removeprefix("void ")).strip()
    return name.split("::")[-1][:48] if "::" in name else name[:48]


def kernel_table(scen: str, runners: dict) -> list[str]:
    """Per variant: kernels per run, device busy time, and its largest kernels, side by side (CUPTI)."""
    lines = ["", f"Kernels, {scen} (CUPTI via torch.profiler, {KERNEL_RUNS} runs; per run):", "",
             "| variant | kernels | busy ms | largest kernels (count x, us) |", "|---|---:|---:|---|"]
    every = []  # the torch variants' whole lists: which small kernels a step could lose
    for name, runner in runners.items():
        try:
            prof = kernel_profile(runner)
        except Exception as exc:  # noqa: BLE001
            lines.append(f"| {name} | failed: {short_error(exc)[:80]} | | |")
            continue
        ranked = sorted(prof["by_name"].items(), key=lambda kv: -kv[1][1])
        cells = "; ".join(f"{k} {n:.0f}x {t * 1e6:.0f}" for k, (n, t) in ranked[:8])
        lines.append(f"| {name} | {prof['kernels']:.0f} | {prof['busy'] * 1e3:.3f} | {cells} |")
        if name.startswith("torch"):
            every.append(f"- {name}, every kernel (count x, us): "
                         + "; ".join(f"{k} {n:.0f}x {t * 1e6:.1f}" for k, (n, t) in ranked))
    return lines + ([""] + every if every else [])


def render_table(rows: list[dict]) -> list[str]:
    fmt = lambda x: "–" if x is None else f"{x:.1e}"  # noqa: E731
    lines = ["| scenario | variant | median ms | p10 ms | p90 ms | x compiled | paired | rel err logits | rel err KV | nodes |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        dims = f"{r['scenario']} (b{r['dims']['batch']} s{r['dims']['seq']} p{r['dims']['past']})"
        if "median" not in r:
            lines.append(f"| {dims} | {r['variant']} | failed | | | | | | | {r['nodes'] or ''} |")
            continue
        err = ("ref", "ref") if r["variant"] == "plain" else tuple(fmt(e) for e in r.get("err", (None, None)))
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else "–"
        paired = f"{r['paired']:.2f}" if r.get("paired") is not None else "–"
        lines.append(f"| {dims} | {r['variant']} | {r['median'] * 1e3:.3f} | {r['p10'] * 1e3:.3f} | {r['p90'] * 1e3:.3f} "
                     f"| {ratio} | {paired} | {err[0]} | {err[1]} | {r['nodes'] or ''} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
