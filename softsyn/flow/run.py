"""`softsyn run DIR`: generate with a compiled decoder on ONNX Runtime, as its runtime/session.json says, and time it.

The artifact runs on its own settings (providers, provider options, session options, the KV cache as the graph
declares it: softsyn.runtime.generate): a seeded random prompt is prefilled, then `gen` tokens are decoded
greedily, `runs` times after `warmup` untimed generations. TTFT is the prefill step, TPOT one decode step (host
wall clock: softsyn.runtime.generate.STEP_INTERVAL), tokens/s the generated tokens over TTFT + their decode steps.
Each step's phases (inputs, run call, readback), the warm-up's cold prefill and the step times softsyn signoff
measured for DIR come with them (softsyn.flow.run_phases), so TTFT reads against the signed-off prefill step.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from softsyn import outdir, progress
from softsyn.emit import MODEL_FILE, SESSION_FILE
from softsyn.errors import SoftsynError
from softsyn.flow.cpu_view import cpu_view_session
from softsyn.frontends.onnx_file import check_external_data, inside
from softsyn.runtime.artifact import check_session, read_json
from softsyn.runtime.decoder import NotDecoder, decoder_io
from softsyn.flow.run_phases import breakdown, signed_off, warmup_rows
from softsyn.runtime.generate import PHASES, STEP_INTERVAL, Generation, Generator, prompt_ids
from softsyn.runtime.session import PROVIDERS, device_name, open_model, provider_of

TAKES = "softsyn run takes the output directory of `softsyn compile MODEL -o DIR`"


@dataclass(frozen=True)
class RunSettings:
    prompt_len: int = 128
    gen: int = 32
    provider: str | None = None  # "cpu" | "cuda"; None: runtime/session.json's first provider
    runs: int = 3
    # two untimed generations: ORT lays a shape's memory pattern out on its second run (onnxruntime PR 15005) and a
    # decode graph is captured in the first generation, so each timed prefill follows both, as signoff's warm runs
    warmup: int = 2
    seed: int = 0


@dataclass
class RunResult:
    directory: str
    design: str
    settings: RunSettings
    execution_provider: str  # what the session got (session.get_providers()[0])
    device: str
    kv: str  # "shared" | "grown"
    max_length: int | None  # the shared buffer's positions
    cuda_graph: bool
    date: str
    generations: list[Generation] = field(default_factory=list)
    viewed: int = 0  # nodes the CPU view rewrote (GQA's q/k norms, fp8 weight MatMuls: a cuda artifact on the CPU)
    interval: str = STEP_INTERVAL  # what one timed step covers (a torch package's: softsyn.flow.torch_artifact)
    states: int = 0  # a hybrid decoder's conv/recurrent state ports, fed back step by step (two buffers each)
    warmups: list[Generation] = field(default_factory=list)  # the untimed generations, the first one cold
    signed_off: dict | None = None  # the step times softsyn signoff measured for DIR (run_phases.signed_off)

    @property
    def ttfts(self) -> list[float]:
        return [g.ttft for g in self.generations]

    @property
    def tpots(self) -> list[float]:
        return [t for g in self.generations for t in g.tpot]

    @property
    def tokens_per_s(self) -> list[float]:
        """Per run: generated tokens / (TTFT + the decode steps), s^-1."""
        return [len(g.tokens) / (g.ttft + sum(g.tpot)) for g in self.generations]

    @property
    def decode_tokens_per_s(self) -> list[float]:
        """Per run: decode steps / their time (the prefill left out), s^-1; empty when only one token is made."""
        return [len(g.tpot) / sum(g.tpot) for g in self.generations if g.tpot]

    def to_dict(self) -> dict:
        def stats(values):
            return {"median": median(values), "p90": p90(values), "min": min(values, default=None),
                    "samples": len(values)} if values else None

        return {"schema": "softsyn.run/1", "directory": self.directory, "design": self.design,
                "date": self.date, "provider": self.execution_provider, "device": self.device,
                "prompt_len": self.settings.prompt_len, "gen": self.settings.gen, "runs": self.settings.runs,
                "warmup": self.settings.warmup, "seed": self.settings.seed, "batch": 1, "decoding": "greedy",
                "kv_cache": self.kv, "max_length": self.max_length, "cuda_graph": self.cuda_graph,
                "cpu_view_nodes": self.viewed, "states": self.states, "units": {"ttft": "s", "tpot": "s", "tokens_per_s": "1/s", "decode_tokens_per_s": "1/s"},
                "interval": self.interval, "ttft": stats(self.ttfts), "tpot": stats(self.tpots),
                "tokens_per_s": stats(self.tokens_per_s), "decode_tokens_per_s": stats(self.decode_tokens_per_s),
                "tokens": list(self.generations[-1].tokens) if self.generations else [],
                "tokens_same_every_run": len({g.tokens for g in self.generations}) <= 1,
                "ttft_runs": self.ttfts, "cold_ttft": any(g.cold for g in self.generations),
                "phases": PHASES, "breakdown": breakdown(self.generations), "warmups": warmup_rows(self.warmups),
                "signed_off": self.signed_off}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def p90(values: list[float]) -> float | None:
    """The nearest-rank 90th percentile (the sample at rank ceil(0.9 n))."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)] if ordered else None


def load_artifact(directory: str | Path) -> tuple[Path, dict, str]:
    """(model.onnx, runtime/session.json, design name) of a compile output; a SoftsynError naming what is wrong."""
    out = Path(directory)
    if not out.is_dir():
        raise SoftsynError(f"{directory}: no such directory; {TAKES}")
    manifest = outdir.read_manifest(out)
    if manifest is None:
        raise SoftsynError(f"{directory}: not a softsyn output directory (no {outdir.MANIFEST}); {TAKES}")
    if manifest.kind != "compile":
        raise SoftsynError(f"{directory}: a softsyn {manifest.kind} output, which holds no compiled model; {TAKES}")
    session = check_session(read_json(out / SESSION_FILE, "runtime/session.json"), out / SESSION_FILE)
    if session.get("plan") or not session.get("model"):
        raise SoftsynError(f"{directory}: a weightless plan (softsyn compile --plan) has no {MODEL_FILE} to run; compile "
                           "without --plan, on a machine with RAM for its weights")
    if session.get("blocks"):
        raise SoftsynError(f"{directory}: a vision-language composite ({', '.join(b['file'] for b in session['blocks'])});"
                           " softsyn run drives one decoder model only (not built yet for composites)")
    model = inside(out, session["model"], "model", out / SESSION_FILE)
    if not model.is_file():
        raise SoftsynError(f"{directory}: no {session['model']} (runtime/session.json names it); re-run softsyn compile")
    return model, session, manifest.design


def run(directory: str | Path, settings: RunSettings = RunSettings(), show_progress: bool = True) -> RunResult:
    """Generate `settings.runs` times with the artifact in `directory` and time every step."""
    model, session, design = load_artifact(directory)
    try:
        graph = ir.load(str(model))
    except Exception as exc:  # noqa: BLE001 - protobuf and onnx-ir raise many types for a file that is no model
        raise SoftsynError(f"{model}: not a readable ONNX model ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                           "re-run softsyn compile") from None
    check_external_data(graph, model)  # inside DIR and whole before ORT loads it: a cut one ran memory out
    try:
        io = decoder_io(graph)
    except NotDecoder as exc:
        raise SoftsynError(f"{model}: not a decoder softsyn run can drive: {exc}") from None
    providers = session.get("providers") or ["CPUExecutionProvider"]
    provider = settings.provider or provider_of(providers[0])
    options = (session.get("provider_options") or {}).get(PROVIDERS[provider]) or {}
    cuda_graph = provider == "cuda" and str(options.get("enable_cuda_graph", "0")) == "1"
    so = session.get("session_options") if isinstance(session.get("session_options"), dict) else {}
    progress.log(f"loading {model} on {PROVIDERS[provider]}", enabled=show_progress)
    viewed = 0
    if provider == "cpu":  # a cuda artifact runs on the CPU as its CPU view (GQA's absorbed q/k norms moved out)
        sess, changed = cpu_view_session(model, so)
        viewed = sum(changed.values())
    else:
        sess = open_model(model, provider, so, cuda_graph=cuda_graph)
    max_length = (session.get("kv_cache") or {}).get("max_length")
    generator = Generator(sess, io, provider, max_length=max_length, cuda_graph=cuda_graph)
    if io.vocab_size is None:
        raise SoftsynError(f"{model}: output {io.logits} has no static vocabulary dim to draw prompt ids below")
    generator.check_room(settings.prompt_len, settings.gen)  # before the prompt is drawn: --prompt-len may be huge
    prompt = prompt_ids(io.vocab_size, settings.prompt_len, settings.seed)
    result = RunResult(directory=str(directory), design=design, settings=settings,
                       execution_provider=sess.get_providers()[0], device=device_name(provider),
                       kv="shared" if generator.shared else "grown", max_length=generator.max_length,
                       cuda_graph=cuda_graph, date=time.strftime("%a %b %d %H:%M:%S %Y"), viewed=viewed,
                       states=len(io.states))
    total = settings.warmup + settings.runs
    for r in range(total):
        label = f"warm-up {r + 1}/{settings.warmup}" if r < settings.warmup else f"run {r - settings.warmup + 1}/{settings.runs}"

        def on_token(done, gen, label=label):
            progress.log(f"{label}: token {done}/{gen}", enabled=show_progress, end="")

        generation = generator.generate(prompt, settings.gen, on_token)
        (result.generations if r >= settings.warmup else result.warmups).append(generation)
    result.signed_off = signed_off(directory, result.execution_provider, settings.prompt_len, settings.gen)
    progress.log(f"generated {settings.gen} tokens after a {settings.prompt_len}-token prompt, {settings.runs} timed "
                 f"run{'s' if settings.runs != 1 else ''} after {settings.warmup} warm-up", enabled=show_progress)
    return result
