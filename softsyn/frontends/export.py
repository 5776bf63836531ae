"""Export transformers models to an onnx-ir netlist with torch.onnx.export(dynamo=True).

Decoder LLMs are exported once with KV-cache inputs/outputs and dynamic dims ``batch``,
``seq`` (new tokens), ``past`` (cached tokens); the attention mask's length is ``total``,
declared as the derived dim ``past + seq``. Models built on the meta device export without
weights: their initializers keep shape and dtype and point at external data that was never
written (see ``META_WEIGHTS``), so they are analysable but not runnable.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import os
import warnings

import onnx_ir as ir

from softsyn.netlist import HIERARCHY_KEY, annotate_hierarchy
from softsyn.netlist.keys import META_WEIGHTS

DYNAMO = "torch.onnx.export(dynamo=True)"
SCOPE_PREFIX = "m"  # attribute name of the wrapped model inside the export wrappers
OPSET = 18


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's chatter (torchvision notices, progress emoji, deprecations)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch._export", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    buf = io.StringIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stdout(buf):
                yield
    finally:
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)


def _kv_geometry(cfg) -> tuple[int, int, int]:
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return layers, kv, head_dim


def _strip_prefix(model: ir.Model, prefix: str = SCOPE_PREFIX) -> None:
    """Initializer names without the wrapper prefix: "m.model.embed_tokens.weight" -> "model.embed_tokens.weight"."""
    g = model.graph
    existing = set(g.initializers)
    for name in list(g.initializers):
        if name.startswith(prefix + "."):
            new = name[len(prefix) + 1 :]
            if new in existing:
                continue
            v = g.initializers.pop(name)
            v.name = new
            g.initializers[new] = v
            existing.add(new)


def make_weightless(model: ir.Model) -> int:
    """Replace initializers whose data is on the meta device by lazy external tensors that are never read.

    Returns the number of initializers replaced. Shape and dtype stay exact, so parameter and
    byte counts are true; reading the data fails (the file does not exist).
    """
    # deferred: torch is seconds to import; only an export needs it
    import torch

    offset = 0
    replaced = 0
    for v in model.graph.initializers.values():
        t = v.const_value
        raw = getattr(t, "raw", None)
        if isinstance(raw, torch.Tensor) and raw.device.type == "meta":
            nbytes = int(math.prod(int(d) for d in v.shape) * v.dtype.itemsize)
            v.const_value = ir.ExternalTensor(
                location=META_WEIGHTS, offset=offset, length=nbytes, dtype=v.dtype, shape=v.shape, name=v.name
            )
            offset += nbytes
            replaced += 1
    return replaced


def name_folded_weights(model: ir.Model) -> int:
    """Give weights the optimizer folded (e.g. Transpose(q_proj.weight) -> "val_82") their module name
    back: "model.layers.0.self_attn.q_proj.weight". Only float tensors with one consuming scope."""
    g = model.graph
    renamed = 0
    for name in list(g.initializers):
        v = g.initializers[name]
        if not name.startswith("val_") or v.dtype is None or not v.dtype.is_floating_point():
            continue
        if v.shape is None or len(v.shape) < 1:
            continue
        scopes = {u.node.metadata_props.get(HIERARCHY_KEY, "") for u in v.uses()}
        if len(scopes) != 1:
            continue
        scope = scopes.pop()
        if not scope:
            continue
        new = f"{scope}.weight"
        if new in g.initializers:
            new = f"{scope}.weight_folded"
            if new in g.initializers:
                continue
        g.initializers.pop(name)
        v.name = new
        g.initializers[new] = v
        renamed += 1
    return renamed


def _finish(model: ir.Model, graph_name: str) -> ir.Model:
    _strip_prefix(model)
    annotate_hierarchy(model, prefix=SCOPE_PREFIX)
    name_folded_weights(model)
    make_weightless(model)
    model.graph.name = graph_name
    return model


def export_decoder(model, name: str, batch: int = 2, seq: int = 3, past: int = 4, optimize: bool | None = None) -> ir.Model:
    """Export a causal LM with KV cache. Example sizes must be > 1 so no dim is specialised."""
    # deferred: torch is seconds to import; only an export needs it
    import torch
    # deferred: transformers is seconds to import; only reading a Hugging Face model needs it
    from transformers.cache_utils import DynamicCache

    cfg = model.config
    layers, kv, head_dim = _kv_geometry(cfg)
    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    meta = device.type == "meta"
    if optimize is None:
        optimize = not meta

    # transformers >= 5.2x names the argument `cache` (past_key_values is deprecated)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    class DecoderWithCache(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, position_ids, *past_kv):
            cache = DynamicCache(config=self.m.config)
            for i in range(len(past_kv) // 2):
                cache.update(past_kv[2 * i], past_kv[2 * i + 1], i)
            kw = {cache_kw: cache}
            out = self.m(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, **kw
            )
            present = out.past_key_values
            flat = [out.logits]
            for i in range(layers):
                layer = present.layers[i]
                flat += [layer.keys, layer.values]
            return tuple(flat)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    mask = torch.ones(batch, past + seq, dtype=torch.long, device=device)
    pos = torch.arange(past, past + seq, dtype=torch.long, device=device).unsqueeze(0).expand(batch, seq).contiguous()
    past_t = tuple(
        torch.randn(batch, kv, past, head_dim, generator=g).to(dtype=dtype, device=device) for _ in range(2 * layers)
    )
    dim = torch.export.Dim
    b, s, p, t = dim("batch"), dim("seq"), dim("past"), dim("total")
    dynamic_shapes = {
        "input_ids": {0: b, 1: s},
        "attention_mask": {0: b, 1: t},
        "position_ids": {0: b, 1: s},
        "past_kv": tuple({0: b, 2: p} for _ in range(2 * layers)),
    }
    in_names = ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")
    ]
    out_names = ["logits"] + [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    wrapper = DecoderWithCache(model).eval()
    with _quiet(), torch.no_grad():
        prog = torch.onnx.export(
            wrapper,
            (ids, mask, pos) + past_t,
            dynamic_shapes=dynamic_shapes,
            dynamo=True,
            input_names=in_names,
            output_names=out_names,
            opset_version=OPSET,
            optimize=optimize,
            verbose=False,
        )
    return _finish(prog.model, name)


def export_encoder(model, name: str, batch: int = 2, seq: int = 5, optimize: bool | None = None) -> ir.Model:
    """Export an encoder (BERT-like): input_ids, attention_mask[, token_type_ids] -> last_hidden_state."""
    # deferred: torch is seconds to import; only an export needs it
    import torch

    param = next(model.parameters())
    device = param.device
    if optimize is None:
        optimize = device.type != "meta"
    has_tt = "token_type_ids" in inspect.signature(model.forward).parameters and getattr(
        model.config, "type_vocab_size", 0
    )

    class Encoder(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kw = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                kw["token_type_ids"] = token_type_ids
            return self.m(**kw).last_hidden_state

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    b, s = torch.export.Dim("batch"), torch.export.Dim("seq")
    args = (ids, mask)
    ds = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
    names = ["input_ids", "attention_mask"]
    if has_tt:
        args += (torch.zeros(batch, seq, dtype=torch.long, device=device),)
        ds["token_type_ids"] = {0: b, 1: s}
        names.append("token_type_ids")
    with _quiet(), torch.no_grad():
        prog = torch.onnx.export(
            Encoder(model).eval(),
            args,
            dynamic_shapes=ds,
            dynamo=True,
            input_names=names,
            output_names=["last_hidden_state"],
            opset_version=OPSET,
            optimize=optimize,
            verbose=False,
        )
    return _finish(prog.model, name)


def rename_dims(model: ir.Model, mapping: dict[str, str]) -> None:
    """Rename symbolic dims on every value (e.g. exporter's "s0" -> "batch")."""
    if not mapping:
        return

    def fix(v):
        if v is None or v.shape is None:
            return
        changed = False
        dims = []
        for d in v.shape:
            if isinstance(d, ir.SymbolicDim) and d.value in mapping:
                dims.append(mapping[d.value])
                changed = True
            else:
                dims.append(d)
        if changed:
            v.shape = ir.Shape(dims)

    g = model.graph
    for v in list(g.inputs) + list(g.outputs) + list(g.initializers.values()):
        fix(v)
    for n in g:
        for v in n.outputs:
            fix(v)


# Public names for the other exporters (softsyn.frontends.vlm).
quiet, kv_geometry, finish = _quiet, _kv_geometry, _finish


def torch_num_threads() -> None:
    # deferred: torch is seconds to import; only an export needs it
    import torch

    n = os.cpu_count() or 1
    if torch.get_num_threads() > n:
        torch.set_num_threads(n)
