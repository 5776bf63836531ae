"""MoE experts -> com.microsoft.MoE.

Anchor: every TopK over a Softmax/Sigmoid (the token -> expert routing), so a router whose experts do
not fuse is counted and explained. The rule reads the exported expert block by data flow, not by
spelling:

* router: ``logits -> Softmax(-1) -> TopK(k)``; the top-k values either feed the combine directly
  (``norm_topk_prob=False``) or through ``v / ReduceSum(v, -1)`` (``norm_topk_prob=True``);
* experts (transformers ``experts_implementation="batched_mm"``): the top-k indices gather per-token
  expert weights from stacked ``[E, out, in]`` (or ``[E, in, out]``) constants, batched MatMuls apply
  them; the gathers whose MatMul reads the token states are FC1 (one fused gate_up split in halves,
  or separate gate and up), the one that reads the activation is FC2;
* combine: ``ReduceSum(weights * expert_out)`` over the k slots.

The rewrite is ``MoE(x, router_logits, fc1, , fc2)`` with ``activation_type="swiglu"``,
``swiglu_fusion=1`` (gate/up interleaved per row: the only SwiGLU layout the CPU kernel takes; the
CUDA kernel takes it too), ``activation_alpha=1, activation_beta=0`` (so the op's
``G * sigmoid(alpha G) * (L + beta)`` is exactly ``silu(gate) * up``) and
``normalize_routing_weights`` from the graph, and ``swiglu_limit=inf`` (softsyn.runtime.moe_op: ORT 1.31.1's
CUDA kernel clamps at 7.0 unless told). The op computes softmax + top-k itself, so it is fed the
router *logits* (the Softmax input), not the probabilities. Before a site is rewritten the candidate
node is evaluated against the expert graph on ORT CPU with probe tokens; a difference is a miss.

Weightless (meta) expert weights fuse too, into weightless fc1/fc2 of the fused shapes: up to
PROBE_WEIGHT_BYTES they get seeded stand-ins and the same probe; above it (a real-size layer: GBs) the site is
matched by data flow alone and the note says how many were. The router's MatMul stays outside the op, held at
fp16/bf16 or wider by the precision rule `moe_router` (passes.rules.router).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.fuse.base import Cell, Replacement, Rule, stand_in
from passes.fuse.chain import Link, follow
from passes.fuse.graph import (MS, add_initializer, add_weightless, attr, const, consumers, downstream,
                                       evaluate, fresh, insert_before, make_node, replace_value, weightless)
from softsyn.runtime.moe_op import MOE_SWIGLU
from softsyn.runtime.session import provider_opens

LAYOUT = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Tile", "Cast", "Identity"}
PROBE_TOKENS = 7
# the CUDA probe (a GPU here, target cuda): prefill-sized, as the departure seen on 2026-12-03 was at prefill (128
# tokens, decode agreed), within fp16 / TF32 rounding (fp32 runs the SM80 CUTLASS path: TF32 math); that departure
# was routing (3 of 128 tokens picked other near-tied experts), the kernel agreed with float64 (moeprobe)
CUDA_PROBE_TOKENS, CUDA_TOLERANCE = 128, 2e-2
CUDA_PROBED_KEY = "softsyn.moe_cuda_probed"  # on a fused node whose candidate ran on this machine's CUDA kernel
# Weightless (meta) expert weights up to this size get seeded stand-ins and the numeric probe; larger ones (a
# real-size layer's experts: GBs) are matched by data flow only, so a plan never allocates them.
PROBE_WEIGHT_BYTES = 64 * 2**20
UNPROBED_KEY = "softsyn.moe_unprobed"  # on a fused node matched by data flow only (the note counts them)


class _Miss(Exception):
    pass


def _single(v: ir.Value, *types: str) -> ir.Node | None:
    us = consumers(v)
    return us[0] if len(us) == 1 and us[0].op_type in types else None


def _back(v: ir.Value) -> list[ir.Value]:
    """v and the values it is a layout-only view of (Reshape/Unsqueeze/Expand/... of the data input)."""
    chain = [v]
    while True:
        p = v.producer()
        if p is None or p.op_type not in LAYOUT or not p.inputs or p.inputs[0] is None:
            return chain
        v = p.inputs[0]
        chain.append(v)


def _forward(v: ir.Value) -> ir.Value:
    """Follow single-consumer layout ops forward (Squeeze/Reshape after a batched MatMul)."""
    while True:
        us = consumers(v)
        if len(us) != 1 or us[0].op_type not in LAYOUT or us[0].inputs[0] is not v:
            return v
        v = us[0].outputs[0]


def _score_node(topk: ir.Node) -> ir.Node | None:
    """The Softmax/Sigmoid the TopK ranks, through Casts (fp16 exports upcast the probabilities)."""
    v = topk.inputs[0] if topk.inputs else None
    while v is not None and v.producer() is not None and v.producer().op_type == "Cast":
        v = v.producer().inputs[0]
    p = v.producer() if v is not None else None
    return p if p is not None and p.op_type in ("Softmax", "Sigmoid") else None


def _weight_like(v: ir.Value) -> bool:
    """A constant, or a weightless weight seen through layout ops (a meta export's Transpose(W))."""
    while v is not None:
        if const(v) is not None or weightless(v):
            return True
        p = v.producer()
        if p is None or p.op_type not in LAYOUT | {"Transpose"} or not p.inputs:
            return False
        v = p.inputs[0]
    return False


def _dtype_np(v: ir.Value):
    return v.dtype.numpy() if v.dtype is not None else np.float32


class MoERule(Rule):
    kind = "moe"
    target_op = "com.microsoft.MoE"

    def anchors(self, ctx):
        return [n for n in ctx.graph if n.op_type == "TopK" and _score_node(n) is not None]

    # ------------------------------------------------------------------ check
    def check(self, ctx, topk):
        try:
            return self._match(ctx, topk)
        except _Miss as m:
            return str(m)

    def _match(self, ctx, topk):
        logits, raw_logits, k = self._router(topk)
        vals, idx = topk.outputs
        weights, normalize = self._routing_weights(vals)
        gathers, stand_ins, E = self._gathers(idx, logits)
        fc1, fc2, x = self._projections(gathers, raw_logits)
        down = fc2[0][1]
        H, inter = int(down.shape[1]), int(down.shape[2])
        if x.shape is not None and isinstance(x.shape[-1], int) and x.shape[-1] != H:
            raise _Miss(f"down projection emits {H} but the tokens have {x.shape[-1]} features")

        gate_w, up_w, act = self._activation(fc1, fc2[0], inter)
        probe = all(w.strides[0] for _, w in stand_ins.values())
        if probe:
            fc1_w = np.stack([gate_w, up_w], axis=2).reshape(E, 2 * inter, gate_w.shape[2])  # interleaved g, l
        else:  # shape-only stand-ins (zero-stride): the weightless rewrite needs the fused weights' shapes only
            fc1_w = np.broadcast_to(gate_w.dtype.type(0), (E, 2 * inter, gate_w.shape[2]))
        out = self._block_output(self._combine(weights, fc2[0][3]), x)
        why = self._target_limits(ctx.target, x, H, inter, k, E)
        if why:
            raise _Miss(why)

        dt = _dtype_np(x)
        m = dict(topk=topk, wname=gathers[0][0].inputs[0].name or "experts", x=x, logits=raw_logits, out=out, k=k,
                 normalize=normalize, act=act, E=E, H=H, inter=inter, weightless=bool(stand_ins),
                 fc1=fc1_w.astype(dt, copy=False), fc2=down.astype(dt, copy=False),
                 feeds=dict(stand_ins.values()))
        if not probe:  # matched by data flow alone; the probe runs on materialised and small weightless sites
            m["verified_rel"] = None
            return m
        rel = self._verify(ctx, m)
        tol = 1e-4 if dt == np.float32 else 2e-2
        if not rel < tol:
            raise _Miss(f"com.microsoft.MoE differs from the expert graph on probe tokens (max rel {rel:.2e} > "
                        f"{tol:g}): the expert math is not silu(gate)*up -> down with softmax top-k routing")
        if ctx.target == "cuda" and provider_opens("cuda"):
            on_target = self._verify_on_cuda(ctx, m)
            if not on_target < CUDA_TOLERANCE:
                raise _Miss(f"ORT's CUDA MoE kernel differs from the expert graph on {CUDA_PROBE_TOKENS} probe tokens "
                            f"(max rel {on_target:.2e} > {CUDA_TOLERANCE:g}) where its CPU kernel agrees ({rel:.2e}): "
                            "kept unfused on cuda")
            m["cuda_probed"] = True
        m["verified_rel"] = rel
        return m

    @staticmethod
    def _router(topk: ir.Node) -> tuple[ir.Value, ir.Value, int]:
        """(the router logits the Softmax reads, the same before any upcast, k): logits -> Softmax(-1) -> TopK(k)."""
        score = _score_node(topk)
        if score.op_type == "Sigmoid":
            raise _Miss("router scores are Sigmoid (DeepSeek/GLM-style gating); com.microsoft.MoE routes by "
                        "softmax over the logits then top-k")
        logits = score.inputs[0]
        if logits is None or logits.shape is None or len(logits.shape) != 2:
            raise _Miss(f"router logits are not 2-D [tokens, experts] (shape {getattr(logits, 'shape', None)})")
        axis = attr(score, "axis", -1)
        if axis not in (-1, 1):
            raise _Miss(f"router Softmax is over axis {axis}, not the expert axis")
        if attr(topk, "axis", -1) not in (-1, 1) or attr(topk, "largest", 1) != 1:
            raise _Miss("TopK is not the largest-k over the expert axis")
        kc = const(topk.inputs[1])
        if kc is None or kc.size != 1:
            raise _Miss("TopK k is not a constant")
        raw_logits = logits
        while raw_logits.producer() is not None and raw_logits.producer().op_type == "Cast":
            raw_logits = raw_logits.producer().inputs[0]  # fp16 exports upcast before the softmax
        return logits, raw_logits, int(np.ravel(kc)[0])

    def _gathers(self, idx: ir.Value, logits: ir.Value) -> tuple[list, dict, int]:
        """(gathers of stacked [E, ., .] expert weights by the top-k indices with the weights, the seeded stand-ins of
        weightless ones (id -> (value, array)), E)."""
        gathers, biases, stand_ins = [], [], {}
        through_layout = lambda u, v: u.outputs[0] if u.op_type in LAYOUT and u.inputs[0] is v else None  # noqa: E731
        for u, v in downstream(idx, through_layout):
            if u.op_type in ("GatherND", "Gather") and u.inputs[1] is v:
                w = const(u.inputs[0])
                if w is None and weightless(u.inputs[0]):
                    w = stand_ins.setdefault(id(u.inputs[0]), (u.inputs[0], self._stand_in(u.inputs[0])))[1]
                if w is None:
                    raise _Miss("expert weights are gathered from a tensor that is not a readable constant "
                                "(external data not on disk): cannot stack fc1/fc2")
                if u.op_type == "Gather" and attr(u, "axis", 0) != 0:
                    raise _Miss("expert weights are gathered along an axis other than the expert axis")
                (gathers if w.ndim == 3 else biases).append((u, w))
            # other uses of the indices (router statistics, say) do not matter to the op
        if not gathers:
            raise _Miss("the top-k indices do not gather stacked expert weights (expected "
                        "experts_implementation=batched_mm; an expert loop/scatter form is not recognised)")
        if biases:
            raise _Miss(f"experts have biases ({len(biases)} gathered [E, n] tensors); bias inputs are not "
                        "implemented in this rewrite")
        num_experts = {int(w.shape[0]) for _, w in gathers}
        if len(num_experts) != 1:
            raise _Miss(f"stacked expert weights disagree on the expert count ({sorted(num_experts)})")
        E = num_experts.pop()
        if isinstance(logits.shape[1], int) and logits.shape[1] != E:
            raise _Miss(f"the router scores {logits.shape[1]} experts but the stacked weights hold {E}")
        return gathers, stand_ins, E

    @staticmethod
    def _projections(gathers: list, raw_logits: ir.Value) -> tuple[list, list, ir.Value]:
        """(FC1 entries, FC2 entries, the token states): an entry (gather, weight [E, out, in], its batched MatMul,
        the MatMul's output past layout ops, the MatMul's other operand); FC1 reads the router's token states."""
        router_in = set()
        rp = raw_logits.producer()
        if rp is not None and rp.op_type in ("Gemm", "MatMul"):
            for i in rp.inputs[:2]:
                if i is not None and not _weight_like(i):
                    router_in = {id(v) for v in _back(i)}
        fc1, fc2, x = [], [], None
        for g, w in gathers:
            mm = follow(g.outputs[0], f"gathered expert weight {g.inputs[0].name}",
                        Link("a (batched) MatMul", ("MatMul",)))
            if isinstance(mm, str):
                raise _Miss(mm)
            mm = mm[0]
            pos = 0 if mm.inputs[0] is g.outputs[0] else 1
            wt = w if pos == 0 else np.transpose(w, (0, 2, 1))  # -> [E, out, in]
            operand = mm.inputs[1 - pos]
            hit = next((v for v in _back(operand) if id(v) in router_in), None)
            entry = (g, wt, mm, _forward(mm.outputs[0]), operand)
            if hit is not None:
                if x is not None and hit is not x:
                    raise _Miss("the expert projections read different token tensors")
                x = hit
                fc1.append(entry)
            else:
                fc2.append(entry)
        if x is None:
            raise _Miss("no expert projection reads the router's token states")
        if len(fc2) != 1 or len(fc1) not in (1, 2):
            raise _Miss(f"expected 1-2 input projections and 1 output projection per expert, found "
                        f"{len(fc1)} and {len(fc2)}")
        return fc1, fc2, x

    @staticmethod
    def _block_output(out: ir.Value, x: ir.Value) -> ir.Value:
        """The value the fused op replaces: the combined output, past the Cast back to the tokens' dtype."""
        if out.dtype is not None and x.dtype is not None and out.dtype != x.dtype:
            # fp16 exports sum the k slots in fp32, then cast back
            back = follow(out, "the combined expert output", Link(f"Cast to the tokens' {x.dtype}", ("Cast",),
                          test=lambda n, _: None if attr(n, "to") == x.dtype else f"it casts to {attr(n, 'to')}"))
            if isinstance(back, str):
                raise _Miss(back)
            out = back[0].outputs[0]
        if out.shape is None or x.shape is None or len(out.shape) != len(x.shape):
            raise _Miss(f"the combined expert output (shape {out.shape}) is not shaped like the tokens ({x.shape})")
        return out

    @staticmethod
    def _stand_in(v: ir.Value) -> np.ndarray:
        """Seeded values for a weightless expert weight small enough to probe, else a zero-stride view of its
        shape (no memory): the weights of a real-size expert block (GBs) are never allocated."""
        shape = tuple(int(d) for d in v.shape)
        dt = v.dtype.numpy()
        if np.prod(shape) * dt.itemsize > PROBE_WEIGHT_BYTES:
            return np.broadcast_to(dt.type(0), shape)
        return (0.05 * np.random.default_rng(len(shape)).standard_normal(shape)).astype(dt)

    def _routing_weights(self, vals):
        """(value that weights the experts, normalize_routing_weights)."""
        users = consumers(vals)
        div = next((u for u in users if u.op_type == "Div" and u.inputs[0] is vals), None)
        if div is not None:
            den = div.inputs[1].producer()
            if den is not None and den.op_type == "Add":  # sum + eps
                eps = [const(i) for i in den.inputs]
                small = [c for c in eps if c is not None and c.size == 1 and abs(float(np.ravel(c)[0])) <= 1e-6]
                den = next((i.producer() for i in den.inputs if const(i) is None), None) if small else den
            if den is None or den.op_type != "ReduceSum" or den.inputs[0] is not vals:
                raise _Miss("top-k routing weights are divided by something other than their sum")
            axes = const(den.inputs[1]) if len(den.inputs) > 1 else attr(den, "axes")
            if axes is None or [int(a) for a in np.ravel(axes)] not in ([-1], [1]):
                raise _Miss("top-k routing weights are normalised over an axis other than the k slots")
            return div.outputs[0], 1
        return vals, 0

    def _activation(self, fc1, fc2, inter):
        """(gate [E, I, H], up [E, I, H], name) from the ops between the input and output projections."""
        a = _back(fc2[4])[-1]  # the activation, before the Unsqueeze for the batched MatMul
        if len(fc1) == 2:
            heads = [(e[3], e[1]) for e in fc1]
        else:
            y, w = fc1[0][3], fc1[0][1]
            split = _single(y, "Split")
            if split is None:
                raise _Miss(self._ungated(a, y))
            sizes = const(split.inputs[1]) if len(split.inputs) > 1 and split.inputs[1] is not None else None
            halves = [inter, inter] if sizes is None else [int(s) for s in sizes]
            if len(split.outputs) != 2 or halves != [inter, inter] or attr(split, "axis", 0) not in (-1, 1) \
                    or w.shape[1] != 2 * inter:
                raise _Miss(f"fused gate/up output is split as {halves} on axis {attr(split, 'axis', 0)}, "
                            f"not two halves of {inter}")
            heads = [(split.outputs[0], w[:, :inter]), (split.outputs[1], w[:, inter:])]
        # the gate is the head the nonlinearity reads; find the ops between each head and the activation
        up_to_a = lambda n, _: n.outputs[0] if n.outputs[0] is not a else None  # noqa: E731
        act_ops = [[n.op_type for n, _ in downstream(v, up_to_a)] for v, _ in heads]
        nonlin = [{"Sigmoid", "Erf", "Tanh", "Relu", "Gelu", "HardSigmoid"} & set(o) for o in act_ops]
        if sum(bool(s) for s in nonlin) != 1:
            raise _Miss(f"cannot tell the gate from the up projection (nonlinear ops per head: "
                        f"{[sorted(s) for s in nonlin]})")
        gi = 0 if nonlin[0] else 1
        kind = nonlin[gi]
        if kind != {"Sigmoid"}:
            name = "GELU (erf)" if "Erf" in kind or "Gelu" in kind else "GELU (tanh)" if "Tanh" in kind \
                else "ReLU" if "Relu" in kind else "/".join(sorted(kind))
            raise _Miss(f"experts are gated with {name} (GeGLU-style); com.microsoft.MoE gates with SiLU only "
                        f"(activation_type swiglu)")
        return heads[gi][1], heads[1 - gi][1], "swiglu"

    @staticmethod
    def _ungated(a, y):
        p = a.producer()
        name = p.op_type if p is not None else "?"
        return (f"experts are not gated (one input projection, activation ends in {name}); only SwiGLU experts "
                f"are rewritten (the op's plain silu/gelu/relu modes are not wired up)")

    def _combine(self, weights, expert_out):
        """The ReduceSum(weights * expert_out) over the k slots; its output replaces the expert block."""
        found = None
        from_expert = {id(expert_out)}
        v = expert_out
        while True:  # values the expert output flows through before the weighting
            us = consumers(v)
            if len(us) != 1 or us[0].op_type not in LAYOUT:
                break
            v = us[0].outputs[0]
            from_expert.add(id(v))
        through_layout = lambda u, _: u.outputs[0] if u.op_type in LAYOUT else None  # noqa: E731
        for u, v in downstream(weights, through_layout):
            if u.op_type == "Mul":
                other = u.inputs[1] if u.inputs[0] is v else u.inputs[0]
                c = const(other)
                if c is not None:
                    raise _Miss(f"routing weights are scaled by a constant ({np.ravel(c)[:1]}, a routed scaling "
                                "factor); com.microsoft.MoE has no such input")
                if id(other) not in from_expert:
                    raise _Miss("routing weights multiply something other than the expert output")
                red = follow(_forward(u.outputs[0]), "weighted expert outputs",
                             Link("one ReduceSum over the k slots", ("ReduceSum",)))
                if isinstance(red, str):
                    raise _Miss(red)
                found = red[0].outputs[0]
        if found is None:
            raise _Miss("routing weights never multiply the expert outputs")
        return found

    @staticmethod
    def _target_limits(target, x, H, inter, k, E) -> str:
        dt = x.dtype
        if not 1 <= k <= E:
            return f"top-k {k} outside 1..{E} experts"
        if target == "cpu":
            if dt not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
                return f"ORT CPU registers com.microsoft.MoE for float and float16 only, not {dt}"
            return ""
        if dt not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
            return f"ORT CUDA registers com.microsoft.MoE for float/float16/bfloat16 only, not {dt}"
        if H < 16 or inter < 16:
            return f"ORT CUDA MoE (CUTLASS) needs hidden and expert width >= 16, got {H} and {inter}"
        align = 4 if dt == ir.DataType.FLOAT else 8  # 128-bit alignment of the GEMM dims
        if H % align or inter % align:
            return (f"ORT CUDA MoE needs hidden ({H}) and expert width ({inter}) multiples of {align} "
                    f"(128-bit aligned {dt})")
        return ""

    # ------------------------------------------------------------------ build / verify / rewrite
    @staticmethod
    def _build(m, register=None):
        def value(name, arr):
            if register is not None and m["weightless"]:
                return register(name, arr.shape, m["x"].dtype)
            if register is not None:
                return register(name, arr)
            return ir.Value(name=fresh(name), shape=ir.Shape(arr.shape),
                            type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)), const_value=ir.tensor(arr))

        base = m["wname"]
        fc1 = value(base + ".moe_fc1", m["fc1"])
        fc2 = value(base + ".moe_fc2", m["fc2"])
        nodes, logits = [], m["logits"]
        if logits.dtype != m["x"].dtype:
            cast = make_node(m["topk"], "", "Cast", [logits], {"to": int(m["x"].dtype)})
            cast.outputs[0].type = ir.TensorType(m["x"].dtype)
            nodes.append(cast)
            logits = cast.outputs[0]
        node = make_node(m["topk"], MS, "MoE", [m["x"], logits, fc1, None, fc2],
                         {"k": m["k"], **MOE_SWIGLU, "activation_type": m["act"],
                          "normalize_routing_weights": m["normalize"]})
        node.outputs[0].type = m["out"].type
        node.outputs[0].shape = m["out"].shape
        nodes.append(node)
        return nodes

    def _verify(self, ctx, m) -> float:
        """Max rel error of the candidate MoE against the expert graph on ORT CPU, on PROBE_TOKENS seeded tokens."""
        ref, got = self._probe(ctx, m, PROBE_TOKENS, "cpu")
        return _rel(got, ref)

    def _verify_on_cuda(self, ctx, m) -> float:
        """Max rel error of the candidate run on this machine's CUDA provider (no CPU fallback) against the expert
        graph on ORT CPU, at CUDA_PROBE_TOKENS: a kernel is trusted on the provider that runs it (2026-12-03: the
        CUDA MoE departed at prefill, 128 tokens, where the CPU one agreed; decode, 1 token, agreed)."""
        try:
            ref, got = self._probe(ctx, m, CUDA_PROBE_TOKENS, "cuda")
        except _Miss:
            raise
        except Exception as exc:  # noqa: BLE001 - ORT raises its own types; the site stays unfused, named
            first = " ".join(str(exc).split())[:200]
            raise _Miss(f"ORT's CUDA MoE kernel cannot run this site ({first}): kept unfused on cuda") from None
        return _rel(got, ref)

    def _probe(self, ctx, m, tokens: int, provider: str) -> tuple[np.ndarray, np.ndarray]:
        """(the expert graph's output on ORT CPU, the candidate's on `provider`) on `tokens` seeded token states."""
        x = m["x"]
        shape = [tokens if not isinstance(d, int) else d for d in x.shape]
        rng = np.random.default_rng(0)
        xs = rng.standard_normal(shape).astype(_dtype_np(x))
        opsets = dict(ctx.model.opset_imports)
        opsets.setdefault(MS, 1)
        feeds = {x: xs, **m["feeds"]}
        # both read router logits with no near-tie at the top-k boundary: top-k is discontinuous, and logits within
        # fp16 rounding of each other (1 token in ~50 of a seeded 128-expert router) pick experts by tie-break, which
        # differs between kernels; that is routing, not the expert math this probe checks (2026-12-03: the CUDA MoE of
        # the 30B-A3B sites was 16-19 % off on such tokens and kept unfused on the H200). So the router never runs.
        feeds[m["logits"]] = separated_logits((int(np.prod(shape[:-1])), m["E"]), _dtype_np(m["logits"]), rng)
        stack, seen = [m["out"]], {id(x), id(m["logits"])}
        while stack:  # other weightless weights the block reads: seeded stand-ins too
            v = stack.pop()
            if v is None or id(v) in seen:
                continue
            seen.add(id(v))
            if weightless(v):
                feeds.setdefault(v, self._stand_in(v))
            elif v.producer() is not None:
                stack.extend(v.producer().inputs)
        try:
            (ref,) = evaluate(ctx.graph, [m["out"]], feeds, opsets)
        except ValueError as e:
            raise _Miss(f"cannot evaluate the expert block from its token input alone ({e})") from None
        nodes = self._build(m)
        try:
            (got,) = evaluate(ctx.graph, [nodes[-1].outputs[0]], feeds, opsets, provider=provider)
        finally:  # the probe nodes are not in the graph: drop their uses of graph values
            for n in nodes:
                for i in range(len(n.inputs)):
                    n.replace_input_with(i, None)
        return np.asarray(ref, np.float32), np.asarray(got, np.float32)

    def rewrite(self, ctx, m):
        ctx.use_opset(MS, 1)
        if m["weightless"]:
            nodes = self._build(m, register=lambda name, shape, dtype: add_weightless(ctx.graph, name, shape, dtype))
        else:
            nodes = self._build(m, register=lambda name, arr: add_initializer(ctx.graph, name, arr))
        if m.get("verified_rel", 0) is None:
            nodes[-1].metadata_props[UNPROBED_KEY] = "1"
        if m.get("cuda_probed"):
            nodes[-1].metadata_props[CUDA_PROBED_KEY] = "1"
        insert_before(ctx.graph, m["out"].producer(), nodes)
        replace_value(ctx.graph, m["out"], nodes[-1].outputs[0])

    def replacement(self, ctx, m) -> Replacement:
        fc1, fc2 = (stand_in(fresh("moe_fc"), m[k].shape, m["x"].dtype) for k in ("fc1", "fc2"))
        cell = Cell("MoE", (m["x"], m["logits"], fc1, None, fc2), (m["out"],), {"k": m["k"]})
        return Replacement((cell,), (m["out"],), (m["x"], m["logits"]))

    def note(self, ctx):
        unprobed = sum(1 for n in ctx.graph if n.op_type == "MoE" and n.metadata_props.get(UNPROBED_KEY))
        extra = (f"; {unprobed} weightless site(s) above {PROBE_WEIGHT_BYTES // 2**20} MiB of expert weights matched "
                 f"by data flow only (not probed)") if unprobed else ""
        return self._note(ctx) + extra

    def _note(self, ctx):
        if ctx.target == "cuda":
            on_gpu = sum(1 for n in ctx.graph if n.op_type == "MoE" and n.metadata_props.get(CUDA_PROBED_KEY))
            probed = (f"{on_gpu} fused site(s) probed on this machine's CUDA kernel too ({CUDA_PROBE_TOKENS} tokens)"
                      if on_gpu else "no fused site probed on a CUDA kernel (" + (
                          "no GPU here" if not provider_opens("cuda") else "none probed") + "): a fused model's prefill on CUDA can "
                      "route a few near-tied tokens to other experts than the CPU does (3 of 128 on 2026-12-03): run "
                      "softsyn verify --locate on the GPU")
            return ("ORT 1.31 CUDA MoE: float/float16/bfloat16 (all inputs one dtype; float runs the SM80 CUTLASS "
                    "path even on SM90), hidden and expert width >= 16 and 128-bit aligned; softmax+top-k on the "
                    f"router logits inside the op; {probed}")
        return ("ORT 1.31 CPU MoE: float/float16, SwiGLU only as interleaved gate/up (swiglu_fusion=1), no fc3; "
                "softmax+top-k on the router logits inside the op")


def separated_logits(shape: tuple[int, ...], dtype, rng: np.random.Generator) -> np.ndarray:
    """Router logits [tokens, experts] whose values per token are a random permutation of experts spaced 1/32 apart
    (exact in fp16 and bf16, tens of fp16 ulps): every token's top-k set is unambiguous on any kernel."""
    tokens, experts = int(np.prod(shape[:-1])), shape[-1]
    ranks = np.argsort(rng.random((tokens, experts)), axis=-1)
    return ((ranks - experts / 2) / 32).reshape(shape).astype(dtype)


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    """max|got - ref| / max|ref| (a shape mismatch is a miss naming both)."""
    if ref.shape != got.shape:
        raise _Miss(f"MoE output shape {got.shape} differs from the expert block's {ref.shape}")
    return float(np.abs(ref - got).max() / (np.abs(ref).max() + 1e-12))
