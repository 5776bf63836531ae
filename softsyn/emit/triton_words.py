"""ASM: softsyn's int4 weight kernel's dequantise-and-multiply in inline PTX (softsyn.emit.triton_weights' ASM
form, for int4 codes and fp16 activations), and its twin in tl ops for Triton's interpreter.

Why: on the H200 (2026-12-06) the F16 form read an int4 lm_head at 1.5 TB/s where fp8 read 4.0: at 8.6 PTX
instructions a weight, issue bounds it. The lop3 + f16x2 dequantisation FasterTransformer and Marlin use is not
what Triton emits from tl ops; here it is ~4 SASS a weight (sm_90, bench/kernel_ptx.py). On the H100 (2026-12-06) it
matched F16's error and beat it at every int4 shape (lm_head 66 vs 109 us), so int4's autotuned configs are ASM's
(triton_weights.ASM_CONFIGS); docs/decisions/2026-12-06-triton-int4.md, "Fewer instructions a weight".
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU-only install: triton_weights then runs its torch fallback, and no word form
    triton = None
    word_dots = None

if triton is not None:
    # ASM's body, one 32-bit word of codes (4 bytes, 8 nibbles) a call: prmt puts two bytes in the halves of a
    # register, lop3 ORs their low nibbles into fp16 1024 (0x6400) or their high ones into fp16 64 (0x5400, whose
    # mantissa steps by 1/16, so bits 4-7 add q), sub leaves q exactly, fma gives q s + l in fp16 (s, l a pair each),
    # and four f16x2 products sum each half's quad (bytes 0 and 2, 1 and 3) before the halves go to fp32
    # one line: Inductor embeds a kernel's constexpr globals by repr in a triple-quoted string, where a "\n" escape
    # becomes a newline and the string literal breaks (AOTInductor's autotuning block: "unterminated string literal",
    # H100, 2026-12-06); PTX needs none between statements
    WORD_DOTS = tl.constexpr(" ".join((
        "{",
        ".reg .b32 t0, t1, q0, q1, q2, q3, xl0, xl1, xh0, xh1, p;",
        ".reg .b16 h0, h1;",
        ".reg .f32 f0, f1;",
        "prmt.b32 t0, $1, 0, 0x4140;",
        "prmt.b32 t1, $1, 0, 0x4342;",
        "lop3.b32 q0, t0, 0x000f000f, 0x64006400, 0xea;",
        "lop3.b32 q1, t0, 0x00f000f0, 0x54005400, 0xea;",
        "lop3.b32 q2, t1, 0x000f000f, 0x64006400, 0xea;",
        "lop3.b32 q3, t1, 0x00f000f0, 0x54005400, 0xea;",
        "sub.f16x2 q0, q0, $6;",
        "sub.f16x2 q1, q1, $7;",
        "sub.f16x2 q2, q2, $6;",
        "sub.f16x2 q3, q3, $7;",
        "fma.rn.f16x2 q0, q0, $4, $5;",
        "fma.rn.f16x2 q1, q1, $4, $5;",
        "fma.rn.f16x2 q2, q2, $4, $5;",
        "fma.rn.f16x2 q3, q3, $4, $5;",
        "mov.b64 {xl0, xl1}, $2;",
        "mov.b64 {xh0, xh1}, $3;",
        "mul.rn.f16x2 p, q0, xl0;",
        "fma.rn.f16x2 p, q1, xh0, p;",
        "fma.rn.f16x2 p, q2, xl1, p;",
        "fma.rn.f16x2 p, q3, xh1, p;",
        "mov.b32 {h0, h1}, p;",
        "cvt.f32.f16 f0, h0;",
        "cvt.f32.f16 f1, h1;",
        "add.f32 $0, f0, f1;",
        "}")))

    @triton.jit
    def twin_weight(codes, shift: tl.constexpr, scale, low):
        """The nibble of the uint32 `codes` at bit `shift` dequantised in fp16, q s + l (WORD_DOTS' lop3, sub, fma)."""
        return ((codes >> shift) & 0xF).to(tl.float16) * scale + low

    @triton.jit
    def twin_x(pairs, k: tl.constexpr):
        """The k-th fp16 of four held in the uint64 `pairs` (little-endian, as the u64 load holds them)."""
        return ((pairs >> (16 * k)) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)

    @triton.jit
    def word_twin(codes, a_lo, a_hi, scale, low):
        """WORD_DOTS in tl ops for Triton's interpreter (which runs no PTX): the same nibbles, activations, quads
        (half h: bytes h and h + 2, low then high nibble) and order, each fp16 op rounded apart where PTX fuses."""
        out = tl.zeros(codes.shape, tl.float32)
        for h in tl.static_range(2):
            p = twin_weight(codes, 8 * h, scale, low) * twin_x(a_lo, h)
            p += twin_weight(codes, 8 * h + 4, scale, low) * twin_x(a_hi, h)
            p += twin_weight(codes, 8 * h + 16, scale, low) * twin_x(a_lo, h + 2)
            p += twin_weight(codes, 8 * h + 20, scale, low) * twin_x(a_hi, h + 2)
            out += p.to(tl.float32)
        return out

    @triton.jit
    def fp16_pairs(v):
        """fp16 `v` as a 32-bit register holding it twice (an f16x2 operand)."""
        return v.to(tl.uint16, bitcast=True).to(tl.uint32) * 65537

    @triton.jit
    def word_dots(x_row, w_rows, s_rows, s_ptr, l_ptr, g, n_ok, GROUP: tl.constexpr, groups,
                  TWIN: tl.constexpr = False):
        """[BLOCK_N, len(g), group / 8], summed: group_dots' F16 form, for int4 codes and fp16 activations (ASM): the
        codes loaded as 32-bit words (8 nibbles) and each word's 4 low-nibble and 4 high-nibble activations as one
        64-bit load each, dequantised (q s + l, fp16) and multiplied by WORD_DOTS (or word_twin where TWIN, in Triton's
        interpreter), a word's two fp16 quads added in fp32; left unsummed (the kernel sums after its loop, no
        shuffles in it). w_rows must be in bounds for every output (the kernel clamps them), and x_row 8-byte aligned
        (`launch` copies a view that is not)."""
        WORDS: tl.constexpr = GROUP // 8  # 32-bit words of codes a group (group / 2 bytes)
        rw = tl.arange(0, WORDS)
        g_ok = g < groups
        # no masks on codes and activations (masked, gated configs held 94-118 registers, not 64-72, sm_90): groups
        # past the row's end read its last (w_rows clamps the outputs past N), and their zero scale and low cancel them
        gc = tl.minimum(g, groups - 1)
        words = (gc[:, None] * WORDS + rw[None, :])[None, :, :]
        codes = tl.load(w_rows.to(tl.pointer_type(tl.uint32), bitcast=True)[:, None, None] + words)
        # word j of a group holds inputs 4j..4j+3 in its low nibbles and half + 4j.. in its high ones: 4 fp16 each
        x_at = x_row.to(tl.pointer_type(tl.uint64), bitcast=True) + (gc[:, None] * (GROUP // 4) + rw[None, :])
        x_at = tl.broadcast_to(x_at[None, :, :], codes.shape)  # each output row's own copy (X_TILE's layout)
        a_lo = tl.load(x_at)
        a_hi = tl.load(x_at + GROUP // 8)
        gate = n_ok[:, None] & g_ok[None, :]
        scale = tl.load(s_ptr + s_rows[:, None] + g[None, :], mask=gate, other=0.0)[:, :, None]
        low = tl.load(l_ptr + s_rows[:, None] + g[None, :], mask=gate, other=0.0)[:, :, None]
        if TWIN:
            out = word_twin(codes, a_lo, a_hi, scale, low)
        else:  # the magic numbers (fp16 1024 and 64, in pairs) as operands: f16x2 subtraction takes registers
            out = tl.inline_asm_elementwise(WORD_DOTS, "=r,r,l,l,r,r,r,r",
                                            [codes, a_lo, a_hi, fp16_pairs(scale), fp16_pairs(low),
                                             tl.full([1, 1, 1], 0x64006400, tl.uint32),
                                             tl.full([1, 1, 1], 0x54005400, tl.uint32)],
                                            dtype=tl.float32, is_pure=True, pack=1)
        return out
