"""DIR/genai_config.json (+ the tokenizer files) for a decoder LLM, in the form onnxruntime-genai 0.18 loads.

The keys and their meaning are the onnxruntime-genai model builder's (`make_genai_config` in its
models/builders/base.py; the accepted keys are its src/config.cpp's): model.{type, context_length, bos/eos/pad
token ids, vocab_size, decoder.{session_options, filename, head_size, hidden_size, num_attention_heads,
num_key_value_heads, num_hidden_layers, inputs, outputs}} and search.{max_length, past_present_share_buffer, the
sampling defaults}. What softsyn knows better than the builder's defaults it writes from the artifact itself:

- the IO names and KV templates, heads, head size and layers are read from the graph (softsyn.runtime.decoder);
- past_present_share_buffer is true only where the graph declares a shared past/present buffer (GQA over a
  `max_length` past); search.max_length is then that buffer's length, else kv_cache.max_length of the design;
- context_length is the model's max_position_embeddings, or fewer where the rotary caches hold fewer positions;
- provider options are runtime/session.json's (`cuda` with its enable_cuda_graph on a GPU target);
- token ids come from the source's generation_config.json, config.json, then tokenizer, as the builder reads
  them; a model that names no EOS (a zoo model built from a config) gets 0, because genai requires an
  eos_token_id inside the vocabulary; the compile log says so.

`write_genai(folder, ...)` writes the files and returns the lines the compile log prints about them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir

from softsyn.frontends.zoo import ZOO, make_config
from softsyn.runtime.decoder import NotDecoder, decoder_io

CONFIG_FILE = "genai_config.json"
# genai's decoder-only LLM types (its models/model_type.h, 0.18); another decoder runs as the generic "decoder"
GENAI_LLM_TYPES = ("chatglm", "decoder", "ernie4_5", "gemma", "gemma2", "gemma3_text", "gpt2", "gptoss", "granite",
                   "internlm2", "lfm2", "llama", "mistral", "nemotron", "olmo", "phi", "phimoe", "phi3", "phi3small",
                   "qwen2", "qwen3", "smollm3")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# SessionOptions keys genai parses as such (others would become config entries); session.json writes these
SESSION_KEYS = ("graph_optimization_level", "intra_op_num_threads", "inter_op_num_threads")
GENAI_PROVIDER = {"CUDAExecutionProvider": "cuda"}  # genai's provider names (CPU is the default: no entry)
SEARCH_DEFAULTS = {"do_sample": False, "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 50, "top_p": 1.0}


@dataclass(frozen=True)
class SourceTokens:
    """What the model's source says about its special tokens and sampling, and where its tokenizer is."""

    bos: int | list[int] | None = None
    eos: int | list[int] | None = None
    pad: int | None = None
    search: tuple[tuple[str, object], ...] = ()  # generation_config.json's sampling settings
    folder: Path | None = None  # the source's folder (HF model folder, or the folder of an .onnx file)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def source_tokens(source: str) -> SourceTokens:
    """Special tokens of `source` (a zoo spec or a path): generation_config.json overrides config.json."""
    if source.startswith("zoo:"):
        entry = ZOO.get(source[4:])
        if entry is None or not entry.model_type:
            return SourceTokens()
        cfg = make_config(entry)
        cfg = getattr(cfg, "text_config", None) or cfg  # a vision-language config keeps its tokens in its text part
        return SourceTokens(getattr(cfg, "bos_token_id", None), getattr(cfg, "eos_token_id", None),
                            getattr(cfg, "pad_token_id", None))
    path = Path(source).expanduser()
    folder = path if path.is_dir() else path.parent
    if not folder.is_dir():
        return SourceTokens()
    cfg, gen = _read_json(folder / "config.json"), _read_json(folder / "generation_config.json")

    def pick(key):
        return next((d[key] for d in (gen, cfg, cfg.get("text_config") or {}) if d.get(key) is not None), None)

    search = tuple((k, gen[k]) for k in SEARCH_DEFAULTS if gen.get(k) is not None)
    return SourceTokens(pick("bos_token_id"), pick("eos_token_id"), pick("pad_token_id"), search, folder)


def save_tokenizer(tokens: SourceTokens, folder: Path, context_length: int, notes: list[str]):
    """Save the source's tokenizer into `folder` as the builder does (model_max_length = context_length, since
    HF's "no limit" 1e30 does not parse as an integer); returns it, or None where the source has none."""
    if tokens.folder is None or not any((tokens.folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        # deferred: transformers is seconds to import; only reading a Hugging Face model needs it
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokens.folder))
        tokenizer.model_max_length = context_length
        tokenizer.save_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 - a tokenizer transformers cannot read is reported, not fatal
        notes.append(f"tokenizer: {tokens.folder} has tokenizer files transformers cannot load "
                     f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); not written")
        return None
    return tokenizer


def _eos(tokens: SourceTokens, tokenizer, source: str, notes: list[str]):
    """EOS as the builder resolves it: config, then tokenizer; the tokenizer's end-of-turn token added."""
    eos = tokens.eos if tokens.eos is not None else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        notes.append(f"{CONFIG_FILE}: {source} names no EOS token; eos_token_id 0 written (genai needs one inside "
                     "the vocabulary), so a generation ends early where the model emits token 0")
        return 0
    ids = list(eos) if isinstance(eos, list) else [eos]
    turn_end = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    return [turn_end, *ids] if turn_end is not None and turn_end not in ids else eos


def provider_options(session: dict) -> list[dict]:
    """genai's provider_options from runtime/session.json's providers and provider_options."""
    options = session.get("provider_options") or {}
    return [{GENAI_PROVIDER[ep]: {k: str(v) for k, v in (options.get(ep) or {}).items()}}
            for ep in session.get("providers") or [] if ep in GENAI_PROVIDER]


def context_length(config: dict, io) -> int:
    """Positions the model serves: max_position_embeddings, or fewer where its rotary caches hold fewer."""
    bounds = [b for b in (config.get("max_position_embeddings"), io.max_positions) if b]
    if not bounds:
        raise NotDecoder("neither max_position_embeddings nor a rotary cache says how many positions it holds")
    return min(bounds)


def layer_count(io) -> int:
    """The decoder's layers: its KV layers, and a hybrid decoder's state layers between them (numbered as the
    model numbers its layers, so the count is the highest number + 1)."""
    if not io.states:
        return len(io.layers)
    return 1 + max([layer.index for layer in io.layers] + [p.layer for p in io.states])


def genai_config(netlist, io, session: dict, source: str, *, tokens: SourceTokens, tokenizer,
                 notes: list[str]) -> dict:
    """The genai_config.json of a compiled decoder whose IO (softsyn.runtime.decoder) is `io`."""
    cfg = netlist.config
    context = context_length(cfg, io)
    asked = (session.get("kv_cache") or {}).get("max_length")
    max_length = io.buffer_length if io.shares_buffer and io.buffer_length else min(asked or context, context)
    model_type = str(cfg.get("model_type") or "")
    if model_type not in GENAI_LLM_TYPES:  # genai spells some without the underscore (ernie4_5 and gemma3_text keep it)
        model_type = model_type.replace("_", "")
    if model_type not in GENAI_LLM_TYPES:
        notes.append(f"{CONFIG_FILE}: model type {cfg.get('model_type')!r} is not one onnxruntime-genai names; "
                     "written as its generic \"decoder\"")
        model_type = "decoder"
    bos = tokens.bos if tokens.bos is not None else getattr(tokenizer, "bos_token_id", None)
    eos = _eos(tokens, tokenizer, source, notes)
    pad = tokens.pad if tokens.pad is not None else getattr(tokenizer, "pad_token_id", None)
    inputs = {"input_ids": io.input_ids}
    inputs.update({k: n for k, n in (("attention_mask", io.attention_mask), ("position_ids", io.position_ids)) if n})
    inputs.update(past_key_names=io.template("past_key_names"), past_value_names=io.template("past_value_names"))
    outputs = {"logits": io.logits, "present_key_names": io.template("present_key_names"),
               "present_value_names": io.template("present_value_names")}
    for kind in sorted({p.kind for p in io.states}):  # a hybrid decoder's states: genai's RecurrentState feeds them
        inputs[f"past_{kind}_names"], outputs[f"present_{kind}_names"] = f"past.%d.{kind}", f"present.%d.{kind}"
    if io.states:
        notes.append(f"{CONFIG_FILE}: {len(io.states)} conv/recurrent state ports named (past_conv_names, "
                     "past_recurrent_names and their presents): onnxruntime-genai 0.18 feeds a hybrid decoder's "
                     "states back step by step")
    so = session.get("session_options") or {}
    search = dict(SEARCH_DEFAULTS, **dict(tokens.search))
    return {
        "model": {
            "bos_token_id": bos if bos is not None else 1,  # the builder's default
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": provider_options(session),
                                    **{k: so[k] for k in SESSION_KEYS if k in so}},
                "filename": session.get("model") or "model.onnx",
                "head_size": io.head_size,
                "hidden_size": cfg.get("hidden_size"),
                "inputs": inputs,
                "outputs": outputs,
                "num_attention_heads": cfg.get("num_attention_heads"),
                "num_hidden_layers": layer_count(io),
                "num_key_value_heads": io.kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": pad if pad is not None else (eos[0] if isinstance(eos, list) else eos),
            "type": model_type,
            "vocab_size": io.vocab_size or cfg.get("vocab_size"),
        },
        "search": {
            "diversity_penalty": 0.0, "do_sample": search["do_sample"], "early_stopping": True, "length_penalty": 1.0,
            "max_length": max_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
            "num_return_sequences": 1, "past_present_share_buffer": io.shares_buffer,
            "repetition_penalty": search["repetition_penalty"], "temperature": search["temperature"],
            "top_k": search["top_k"], "top_p": search["top_p"],
        },
    }


def write_genai(folder: Path, netlist, session: dict, source: str) -> list[str]:
    """Write genai_config.json (and the source's tokenizer) into `folder` for a decoder or a vision-language
    composite (whose blocks are already in `folder`); the compile log's lines."""
    if netlist.kind not in ("decoder", "vlm"):
        return []
    notes: list[str] = []
    if session.get("plan"):
        return [f"{CONFIG_FILE}: not written for a plan (no model.onnx to load)"]
    blocks = {b["name"]: b for b in session.get("blocks") or []}
    try:
        if blocks:  # the decoder block takes the embedding's inputs_embeds (and DeepStack's embeds)
            io = decoder_io(ir.load(str(folder / blocks["decoder"]["file"])), token_input=EMBEDS,
                            extra=tuple(p for p in blocks["decoder"]["inputs"] if p.startswith("deepstack")))
        else:
            io = decoder_io(netlist.model)
        context = context_length(netlist.config, io)
    except NotDecoder as exc:
        return [f"{CONFIG_FILE}: not written: {exc}"]
    tokens = source_tokens(source)
    tokenizer = save_tokenizer(tokens, folder, context, notes)
    if tokenizer is None and not notes:
        notes.append(f"tokenizer: {source} has no tokenizer files (a model built from its config); none written: "
                     "give onnxruntime-genai token ids (Generator.append_tokens)")
    config = genai_config(netlist, io, session, source, tokens=tokens, tokenizer=tokenizer, notes=notes)
    if blocks:
        multimodal_sections(config, blocks, notes)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=4, allow_nan=False) + "\n")
    search = config["search"]
    kv = ("the graph updates one max_length KV buffer in place" if search["past_present_share_buffer"] else
          "the graph's present is its own tensor, the next step's past")
    notes.append(f"{CONFIG_FILE}: onnxruntime-genai {config['model']['type']}, max_length {search['max_length']}, "
                 f"past_present_share_buffer {str(search['past_present_share_buffer']).lower()} ({kv})")
    return notes


EMBEDS = "inputs_embeds"


def multimodal_sections(config: dict, blocks: dict, notes: list[str]) -> None:
    """genai's multimodal layout (its config.h: model.vision, model.embedding, decoder.inputs.embeddings), from a
    composite's blocks; the ports genai's config has no key for are named in the notes."""
    model = config["model"]
    decoder = model["decoder"]
    decoder["filename"] = blocks["decoder"]["file"]
    inputs = {k: v for k, v in decoder["inputs"].items() if k != "input_ids"}
    decoder["inputs"] = {"embeddings": EMBEDS, **inputs}
    vision, embedding = blocks["vision"], blocks["embedding"]
    model["vision"] = {"filename": vision["file"], "inputs": {"pixel_values": vision["inputs"][0]},
                       "outputs": {"image_features": vision["outputs"][0]}}
    model["embedding"] = {"filename": embedding["file"],
                          "inputs": {"input_ids": embedding["inputs"][0], "image_features": embedding["inputs"][1]},
                          "outputs": {"embeddings": embedding["outputs"][0]}}
    unnamed = [p for b in blocks.values() for p in b["inputs"] + b["outputs"] if p.startswith("deepstack")]
    if unnamed:
        notes.append(f"{CONFIG_FILE}: {', '.join(sorted(set(unnamed)))} (DeepStack) have no key in onnxruntime-genai's "
                     "config: a runner must pass them between the blocks itself")
    notes.append(f"{CONFIG_FILE}: vision/embedding/decoder sections; no processor_config.json and no image_grid_thw "
                 "input (the vision block's grid is fixed per export)")
