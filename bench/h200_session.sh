#!/usr/bin/env bash
# One H200 session through the `device` tool, step by step (the machine keeps /tmp only while warm, ~30 s
# between calls, so the calls go back to back). Each call runs `bash bench/h200_session.sh STEP ...`:
#
#   wheels               carry [".whl"]: onnx-ir 1.1 + transformers 5.24 + torchao 0.18 (+ gemlite 0.6) wheels (the image's are older
#                        or absent)
#   part DIR             carry [DIR] (.ortgpu/r_part00 .. 05): one piece of the onnxruntime-gpu wheel
#   install DIR          carry [DIR] (.ortgpu/r_part06): last piece, install ORT-GPU + wheels + softsyn
#   characterize [S]     resume the H200 library from softsyn/library/libs/h200-ort-cuda.yaml for S seconds (570)
#   fresh [S]            characterise the whole H200 library from nothing (ceilings, then every cell) for S seconds;
#                        a second `fresh` call resumes it (the device time of both calls is the library's cost)
#   graphcells [S]       the graph tables (softsyn characterize --graph: MatMul.fp16, MatMulNBits int4/int8 and GQA fp16 at
#                        one row, timed as CUDA graph replays) added to the shipped H200 library for S seconds (300); later
#                        steps of the session put the result in the tree's library first (softsyn_install), so they time
#                        captured decode with them; AGAIN=1 measures them again (rows up to GRAPH_MAX_ROWS), CELLS=...
#                        names other cells
#   cells EAGER [GRAPH] [S]  new cells added to the shipped H200 library within S seconds (420): the cells matching
#                        EAGER (a --cells pattern) characterised, then those matching GRAPH (if not "-") as graph tables
#                        (--graph); AGAIN=1 measures them again though the library has them (a recipe changed); later
#                        steps put the result in the tree's library first, as after graphcells
#   next80b [L]          Qwen3-Next-80B-A3B's real widths (512 experts top-10, DeltaNet 16/32 heads of 128, gated
#                        attention 16/2 of 256, vocab 151936) cut to L layers (2: one Gated DeltaNet, one gated
#                        attention; 4: the 3:1 pattern), seeded weights, compiled for the H200 under tiny-h200.yaml's
#                        groups (prefill 128, decode at 256 as a CUDA graph; area 141 GB), verified, signed off on cuda:
#                        issue 29's predicted vs measured per group at real widths
#   locate [DIR]         softsyn verify DIR --locate (DIR: /tmp/qwen3-next-h200, zoo:qwen3-next-tiny compiled for the
#                        H200 first when absent): the nodes whose CUDA values depart from the CPU run of the same model
#   kvint8               bench/kv_int8.py --provider cuda (the int8 GQA cache on CUDA against ORT CPU's, the fp8 cache
#                        probe, decode fp16 vs int8), then qwen3-tiny compiled with kv_cache.dtype int8 (tiny-h200.yaml),
#                        verified, run and signed off on cuda
#   drift [S]            bench/launch_drift.py: the host's launch overhead and probe sampled for S seconds (120)
#   peers [MODEL]        bench/compare_peers.py --provider cuda on MODEL (qwen3-1.7b) with the genai builder; brings back
#                        the table and the compiled artifact's fusion report
#   peers4 DIR [MODEL]   compare_peers on DIR (an artifact `loop` compiled, e.g. /tmp/chat-h200-int4) beside the builder's
#                        int4 model (-p int4) and the --effort low fp16 build, eager and as CUDA graphs, the plain export as the reference
#   torchtiny            zoo:qwen3-tiny compiled for h200-torch (fp16 AOTInductor package, CUDA graphs), verified, run;
#                        INT4=1: under an int4 map instead (precision default int4, budget 90 %: torchao's tinygemm
#                        int4 layers in the package)
#   script NAME [ARGS]   bench/NAME (a CUDA check with a main: attention_step_check.py; prologue_check.py and
#                        prompt_check.py are parts of torch_kernels.py: torchkernels --parts prologue / prompt) run
#                        with softsyn installed, its output in $OUT/NAME.log; after torchonly too
#   torchkernels [ARGS]  bench/torch_kernels.py ARGS (SWEEP=0: the chain without its config sweep; --parts softsyn,gemlite: those tables only; attnchain,package: each decode
#                        attention form over 28 layers' caches with its kernels, and whether softsyn's packages;
#                        layerchain: a step's GEMVs layer after layer, 28 layers, fp16 and int4, and what a near-empty
#                        kernel costs in a graph): the h200-torch lowering's attention forms (sdpa, matmul, split, softsyn), packed
#                        vs separate projections, each decode GEMV under Inductor's settings (default, coordinate
#                        descent, max-autotune) and as mul + sum, and fp16 vs int4 (tinygemm, g32/g128) GEMVs at
#                        qwen3-1.7b's shapes, compiled by Inductor, as CUDA graph replays (~80 s)
#   torchonly STEP ARGS  carry [".whl"]: STEP (torchkernels, torch or torchbg) on a fresh machine in one call, without
#                        onnxruntime-gpu (the torch targets need none): the wheels and softsyn, then the step, e.g.
#                        `torchonly torchkernels --parts package,chain` (the package checks print first, so a call cut
#                        short still says whether they built; `torchonly torch ...` compiles against the image's
#                        onnxruntime 1.30 CPU build, untried as of 2026-12-06); peerst and the ORT steps still need the
#                        full setup
#   warm [MODEL] [S]     softsyn analyze zoo:MODEL (qwen3-1.7b) under CONS within S seconds (300): the export cache
#                        filled, so a `torch` step in the next call spends its limit on the packages (TORCH_ONLY=1 after
#                        torchonly, e.g. `torchonly torchkernels ...; TORCH_ONLY=1 bash bench/h200_session.sh warm`)
#   torch [MODEL] [S]    zoo:MODEL (qwen3-1.7b) compiled for h200-torch under constraints/chat-h200-torch.yaml (CONS=...:
#                        another file, e.g. constraints/chat-h200-torch-int4.yaml; TAG=int4: into /tmp/torch-MODEL-int4) into
#                        /tmp/torch-MODEL within S seconds (585): two packages (model.pt2, matmul attention, for decode;
#                        model-prefill.pt2, SDPA, for seq > 1), each exported + AOTInductor-compiled (model.pt2 alone
#                        took 161 s of a ~240 s compile on 2026-12-03 17:12: with two, estimate ~400 s; pass S >= 560),
#                        measured per path group (reports/torch.rpt) and its macro cells characterised (copied:
#                        torch-MODEL-macros.rpt/.json); the log's "packages built" line times each one;
#                        then "shared weights: yes|NO|no, by design ..." (bench/torch_shared_weights.py): device memory
#                        taken by loading both packages in softsyn's runner vs model.pt2's weight blob (one copy
#                        expected, two where the prefill package holds its own: prefill_weights resident)
#   torchbg [MODEL] [S]  the `torch` step's compile detached from the call (setsid), waiting up to S seconds (560) for
#                        it: qwen3-1.7b's int4 compile outlasted a 585 s call on the H200 (2026-12-06 20:27, still in
#                        AOTInductor); the compile goes on while the machine stays warm (a call within 30 s)
#   torchwait [MODEL] [S]  wait up to S seconds (580) more for torchbg's compile (same MODEL and TAG); when it has
#                        ended, the `torch` step's results (log tail, packages, reports, kernels.json)
#   torchsignoff DIR     softsyn signoff DIR --provider cuda on a `torch` step's artifact: per group measured vs the
#                        estimate, the largest kernels per step; then softsyn verify DIR (the package against the fp32
#                        reference on the CPU, ~190 s at 1.7B; VERIFY=0 skips it); runs after torchonly (TORCH_ONLY=1)
#   peerst DIR [MODEL]   compare_peers (fp16) with variant torch = DIR (a `torch` step's artifact) beside the compiled
#                        ORT artifact and the builder's fp16 model, eager and as CUDA graphs; the kernels side by side;
#                        BUILDER=int4: the builder's int4 model instead, VARIANTS=...: another variant list,
#                        TORCH2=DIR2: a second torch artifact in the same rounds (variant torch2: e.g. the int4 map
#                        of CONS=constraints/chat-h200-torch-int4.yaml beside the fp16 one)
#   ttft [DIR]           issue 27 item 4, softsyn run against softsyn signoff on one artifact: DIR (default
#                        /tmp/ttft-MODEL: zoo:qwen3-1.7b, MODEL=..., compiled --effort low under constraints/chat-h200.yaml
#                        when absent, reused while the machine is warm) signed off on cuda once (prefill seq 512, decode
#                        past 4096 as a CUDA graph), then run at the signed-off steps: --prompt-len 512 (TTFT beside the
#                        prefill step) and --prompt-len 4095 --gen 8 (decode pasts 4095-4101: TPOT beside the decode
#                        step), each with its phases (inputs, run call, readback), its warm-ups and each run's TTFT, and
#                        once more with --warmup 1 (the old default: whether the first timed prefill is the outlier)
#                        and on a copy DIR-eager without enable_cuda_graph (whether the graph-capture session's eager
#                        prefill is the slow one); RUNS=2: the first two runs only; brings back ttft-*.txt. When the compile leaves too little of the
#                        call, call `ttft` again (it reuses DIR, its signoff and DIR-eager while the machine is warm)
#   tiny                 zoo:qwen3-tiny compiled for the H200 (constraints/tiny-h200.yaml), then `softsyn run --provider
#                        cuda` (its session.json: decode captured as a CUDA graph) and `softsyn signoff --provider cuda`
#   qwen3next            zoo:qwen3-next-tiny (the hybrid cache: conv/recurrent states beside the KV; the delta rule as
#                        com.microsoft.LinearAttention) compiled for the H200 (constraints/tiny-h200.yaml: fp16, decode
#                        planned as a CUDA graph, one per state parity), verified on cuda, run on cuda, and 32 greedy
#                        tokens compared with transformers' (softsyn's loop and onnxruntime-genai-cuda where installed)
#   loop CONSTRAINTS [S] zoo:qwen3-1.7b (MODEL=...) compiled --effort ultra (EFFORT=...) under CONSTRAINTS
#                        (chat-h200-int4.yaml) into /tmp/NAME (the file's stem, -EFFORT when EFFORT is given) within S
#                        seconds (580); ultra's measured re-timing runs inside it. BUDGET=90% replaces the file's
#                        accuracy budget. A 1.7B model at ultra with fp8 offered needs two calls back to back: the
#                        first spends ~320 s on the 13 per-role sensitivity runs and fills the cache in /tmp, the
#                        second reads them (2026-12-02: optimize done at 231 s, then KV moves and the 3.4 GB emit)
#   signoff NAME         softsyn signoff /tmp/NAME --provider cuda (the next call, while the machine is warm)
#   bf16 [S]             issue 29 item 4's must-show: the bf16 cells characterised first where the library lacks them
#                        (SimplifiedLayerNormalization.bf16 and SkipSimplifiedLayerNormalization.bf16 eager, MatMul.bf16
#                        as a graph table; the `cells` step's way), then zoo:qwen3-1.7b (MODEL=...) compiled --effort
#                        medium (EFFORT=...) under CONS (constraints/chat-h200-fp8-bf16.yaml: fp16, bf16 and fp8 per
#                        cell, accuracy.fallback: bf16; BUDGET=0.5% forces the fallback) into /tmp/NAME, NAME the
#                        constraints file's stem, within S seconds (540), then verified on cuda; brings back the
#                        compile's output, compile.log, precision.rpt, session.json's precision_map and the verify
#                        table; `signoff NAME` in the next call measures it. The log's "bf16:" line says if the loop
#                        pruned bf16 (no faster than fp16 with its Casts in any group) and the fallback line if it
#                        fell back. CONS=constraints/chat-h200-bf16-fp8.yaml (precision.default bf16, allowed bf16 and
#                        fp8): the loop starts from uniform bf16 cells and moves some to fp8 (its "start:" line and
#                        "the map: N fp8 + M bf16 cells"); NAME chat-h200-bf16-fp8
#   sensitivity [M] [C]  bench/sensitivity.py --mode role: MODEL's (qwen3-1.7b) per-role int4/int8 errors on cuda under
#                        constraints C (chat-h200-int4.yaml), and the whole model at each measured against the estimate
#   moe                  bench/moe_cuda.py: qwen3-moe-tiny and a 4-layer Qwen3-30B-A3B, fused vs plain, predicted vs measured
#   moecells [S]         the MoE*/QMoE* cells (quick grid) added to the shipped H200 library, for S seconds (300);
#                        FULL=1: the full grid (20 points + 24 hold-outs a cell: tokens 1-2048, Qwen3-30B-A3B and
#                        235B-A22B widths), resumed cell by cell from the tree's library, so calls in later sessions
#                        go on where one stopped (commit the brought-back h200-ort-cuda.yaml between them); a CUDA
#                        failure records its cell as not characterised and stops the run (exit 2): the next call
#                        goes on from the next cell; on an H200 only (characterize refuses the H200 library on another
#                        device, exit 2)
#   qmoe [S]             bench/moe_cuda.py --only 30b --layers 2 --forms fp16,qmoe within S seconds (560; 4 layers ran
#                        past 420 s on 2026-12-03): the 2-layer Qwen3-30B-A3B compiled with
#                        QMoE int4 experts (--effort medium, a budget that admits them), verified, and signed off
#                        beside the fp16 MoE design in one run (the must-show of issue 29 item 2); brings back
#                        moe-qmoe-cuda.md, moe-qmoe.log (the loop's verdicts) and each compile's whole log
#                        (moe-qmoe-cuda-1-fp16-compile.log, moe-qmoe-cuda-1-qmoe-compile.log); fp16 is the fused fp16 MoE design
#                        under the qmoe form's constraints and library (same scenarios), compiled --effort low
#   moeprobe             bench/moe_probe.py --provider cuda: one com.microsoft.MoE node on CUDA and CPU against a float64
#                        reference over tokens 1..128, the tiny/30B/80B expert shapes, fp16/fp32, normalize 0/1 and
#                        x [T, H] vs [1, T, H] (the qwen3-next prefill departure of 2026-12-03); brings back
#                        moe-probe-cuda.md
#   families             bench/family_signoff.py --provider cuda: GPT-2-small and BERT-base plain exports signed off
#   serving [C] [S]      bench/serving_validate.py --provider cuda: zoo:qwen3-1.7b (MODEL=...) compiled --effort low
#                        under C (constraints/serving-h200.yaml) into /tmp/serving (reused while the machine is warm),
#                        then its batched decode at N = 1, 4, 8, 16 and the mixed step beside the compile's step table,
#                        and the serving simulation beside a continuous-batching run under the same arrival trace, for
#                        S seconds (240) or what the call has left after the compile (PAST: the decode rows' mean pasts,
#                        320,1536; EAGER=1: decode without CUDA graphs); when the compile leaves under 90 s, call
#                        `serving` again: it reuses the artifact. First bench/host_probe.py --provider cuda writes the
#                        host's serving_host block (an iteration's host work: inputs, argmax, bindings, logits back, KV
#                        row-move copies; softsyn.characterize.host, ~2 s) into the tree's h200-ort-cuda.yaml, so the
#                        compile's simulation adds it; brings back serving-host-cuda.yaml (the block) and
#                        h200-ort-cuda.yaml (commit the block into softsyn/library/libs/)
#   correlation MODEL..  bench/correlation.py --provider cuda on those zoo models with the fresh library; brings
#                        back the table, the log and corr-MODELS.tgz (analyze/signoff dirs + each graph)
#   vl [S]               zoo:qwen3-vl-2b-reduced (Qwen3-VL-2B's widths, 4 text layers, 4 vision blocks, seeded weights)
#                        compiled for h200-ort-cuda under constraints/vl-h200.yaml (896x896: vision_encoder, ocr at
#                        batch 4, gui_agent, math, decode) into /tmp/vl-h200 within S seconds (330), verified on cuda,
#                        then `softsyn signoff --provider cuda` (each group's blocks run in turn, predicted vs measured
#                        per group and cell) in what the call has left; brings back vl-signoff.rpt, vl-compile.log,
#                        the compile's and verify's output. On a warm machine a second `vl` reuses the artifact (when
#                        the first call's compile left the signoff too little time)
#
# .ortgpu/ holds the onnxruntime-gpu 1.31.1 wheel (CPython 3.12, manylinux_2_28: `pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 onnxruntime-gpu==1.31.1`) cut into 40 MiB
# pieces, since a piece plus the working tree (~15 MiB on 2026-12-06; 50 MiB pieces no longer fit) must pass the
# device's 64 MiB carry limit: for K in 00 .. 06: .ortgpu/r_partK/partK from
#   cd .ortgpu && split -b 40M -d -a 2 onnxruntime_gpu-1.31.1-*.whl part && for f in part0*; do mkdir r_$f; mv $f r_$f/; done
# .whl/ from `pip download` (README "Benchmarks").
# Results land in $OUT (the device tool brings them back); the library stays in /tmp/h200-lib.yaml between calls.
set -euo pipefail
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 SOFTSYN_CACHE=/tmp/softsyn-cache
NV=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$NV/cu13/lib:$NV/cudnn/lib
LIB=/tmp/h200-lib.yaml
WHEEL=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

# each call gets a fresh copy of the tree: the graph tables a `graphcells` call measured ($LIB.graph) go back in first
stage_wheels() {  # the wheels' packages (not onnxruntime-gpu) into /tmp/whl
    mkdir -p /tmp/whl /tmp/genai && cp .whl/onnx_ir-*.whl .whl/transformers-*.whl .whl/torchao-*.whl /tmp/whl/
    cp .whl/gemlite-*.whl /tmp/whl/ 2>/dev/null || echo "no gemlite wheel in .whl (docs/h200.md): torchkernels skips its rows"
    cp .whl/onnxruntime_genai-*.whl /tmp/genai/ 2>/dev/null || true
}

torch_results() {  # NAME LOG CODE: a finished torch compile's log tail, then its packages, shared weights and reports
    local name=$1 log=$2 code=$3
    echo "compile exit $code"
    # --debug: a failed lowering's trace stays in the log (Inductor's worker traceback after "An exception occurred
    # in a subprocess:"), whose lines the warnings would push out of the tail
    grep -v "No registered plugin EP\|UserWarning\|FutureWarning\|return cls\|warnings.warn\|Online softmax\|split the reduction\|important use\|^softmax\.\|^$" \
        "$log" | tail -60
    [ "$code" -eq 0 ] || exit "$code"  # no artifact: the checks below would only report its absence
    ls -l /tmp/$name/*.pt2 2>/dev/null || true
    python3 bench/torch_shared_weights.py /tmp/$name 2>&1 | grep -v "No registered plugin EP" | tail -3 || true
    cp /tmp/$name/reports/torch.rpt "$OUT/$name.rpt" 2>/dev/null || true
    cp /tmp/$name/reports/torch_macros.rpt "$OUT/$name-macros.rpt" 2>/dev/null || true
    cp /tmp/$name/runtime/torch_macros.json "$OUT/$name-macros.json" 2>/dev/null || true
    cp /tmp/$name/runtime/torch_kernels.json "$OUT/$name-kernels.json" 2>/dev/null || true
}

torch_wait() {  # NAME S: wait up to S seconds for torchbg's detached compile; its results when it ends
    local name=$1 waited=0
    [ -f /tmp/$name.log ] || { echo "h200_session torchwait: no compile of $name on this machine (torchbg starts one;" \
        "a released machine keeps nothing)"; exit 2; }
    # -s: the exit code written (the file exists, empty, for a moment before); the log copied after that check, so an
    # ended compile's log is whole
    while [ ! -s /tmp/$name.code ] && [ $waited -lt "$2" ]; do sleep 5; waited=$((waited + 5)); done
    local ended=0
    [ -s /tmp/$name.code ] && ended=1
    cp /tmp/$name.log "$OUT/$name-compile.txt"
    if [ $ended = 0 ]; then
        grep "^\[softsyn\]" /tmp/$name.log | tail -5 || true
        echo "still compiling after ${waited} s: call \`torchwait\` again within 30 s (the machine stays warm)"
        return 0
    fi
    torch_results "$name" "$OUT/$name-compile.txt" "$(cat /tmp/$name.code)"
}

softsyn_install() {
    [ -f $LIB.graph ] && cp $LIB.graph softsyn/library/libs/h200-ort-cuda.yaml
    python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null
}

step=$1
shift
# the machine keeps /tmp only while warm: a step on a fresh one would fall back to ORT's CPU build and waste the call
case $step in
wheels|part|install|torchonly|torchwait) ;;
torchkernels|torch|torchbg|warm|torchsignoff|script) [ -d /tmp/site/onnxruntime ] || [ -n "${TORCH_ONLY:-}" ] || { echo "h200_session $step:" \
       "onnxruntime-gpu is not installed on this machine: run wheels, part x6 and install first, or torchonly $step"
       exit 2; } ;;
*) [ -d /tmp/site/onnxruntime ] || { echo "h200_session $step: onnxruntime-gpu is not installed on this machine" \
       "(a fresh one: the last was released): run wheels, part x4 and install first"; exit 2; } ;;
esac
case $step in
wheels)
    stage_wheels
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv ;;
part)
    mkdir -p /tmp/ortw && cp "$1"/part0* /tmp/ortw/ && ls -la /tmp/ortw ;;
install)
    cp "$1"/part0* /tmp/ortw/
    cat /tmp/ortw/part0* > "/tmp/ortw/$WHEEL"
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "/tmp/ortw/$WHEEL" /tmp/whl/*.whl
    softsyn_install
    python3 -c "import onnxruntime as o, onnx_ir, transformers; print(o.__version__, o.get_available_providers(), onnx_ir.__version__, transformers.__version__)" ;;
characterize)
    softsyn_install
    [ -f $LIB ] || cp softsyn/library/libs/h200-ort-cuda.yaml $LIB
    # what plain and compiled fp16 decoders use first (fp16 cells, then the int64/bool/fp32 glue ops), then the rest
    glue=Cast,Shape,Range,And,Or,Not,Equal,Less,LessOrEqual,Greater,GreaterOrEqual,Where,Concat,Slice,Gather,GatherND
    glue=$glue,Unsqueeze,Squeeze,Reshape,Identity,Expand,Split,Transpose,Add,Sub,Mul,Div,Neg,Max,Min,Pow,Sqrt,IsNaN
    glue=$glue,Reciprocal,ReduceMean,ReduceSum,ReduceMax,Softmax,Sigmoid,Cos,Sin,TopK,Exp,Log,Tanh,Relu,Abs,Erf
    set +e
    timeout "${1:-570}" bash -c "softsyn characterize --runtime ort --provider cuda --cells '*.fp16*,Run' -o $LIB &&
        softsyn characterize --runtime ort --provider cuda --cells '$glue' -o $LIB &&
        softsyn characterize --runtime ort --provider cuda -o $LIB" 2>&1 | tee "$OUT/characterize.log"
    set -e
    cp $LIB "$OUT/h200-ort-cuda.yaml" ;;
fresh)
    softsyn_install
    [ -f $LIB.fresh ] || rm -f $LIB  # the first call starts from nothing (a resumed call keeps what it measured)
    touch $LIB.fresh
    set +e
    timeout "${1:-570}" softsyn characterize --runtime ort --provider cuda -o $LIB 2>&1 | tee -a "$OUT/characterize.log"
    set -e
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    cp $LIB "$OUT/h200-ort-cuda.yaml" ;;
graphcells)
    softsyn_install
    [ -f $LIB ] || cp softsyn/library/libs/h200-ort-cuda.yaml $LIB
    set +e
    # AGAIN=1: measured again though the library has them (GRAPH_MAX_ROWS grew); CELLS=...: those cells only
    timeout "${1:-300}" softsyn characterize --runtime ort --provider cuda --graph ${AGAIN:+--again} \
        --cells "${CELLS:-MatMul.fp16,MatMulNBits.int4,MatMulNBits.int8,GroupQueryAttention.fp16}" -o $LIB 2>&1 |
        tr '\r' '\n' | grep -v "No registered plugin EP\|: pass 1/1 point" | tail -20
    set -e
    cp $LIB "$OUT/h200-ort-cuda.yaml"
    grep -q "ort-cuda-graph" $LIB && cp $LIB $LIB.graph || echo "no graph table measured" ;;
cells)
    softsyn_install
    [ -f $LIB ] || cp softsyn/library/libs/h200-ort-cuda.yaml $LIB
    eager=$1 graph=${2:--}
    set +e
    again=${AGAIN:+--again}  # AGAIN=1: the cells named are measured again though the library has them
    timeout "${3:-420}" bash -c "softsyn characterize --runtime ort --provider cuda --cells '$eager' $again -o $LIB &&
        { [ '$graph' = - ] || softsyn characterize --runtime ort --provider cuda --graph --cells '$graph' $again -o $LIB; }" 2>&1 |
        tr '\r' '\n' | grep -v "No registered plugin EP\|: pass 1/1 point" | tail -30
    echo "characterize exit ${PIPESTATUS[0]}"
    set -e
    cp $LIB "$OUT/h200-ort-cuda.yaml"
    cp $LIB $LIB.graph ;;
drift)
    softsyn_install
    [ -f $LIB ] || cp softsyn/library/libs/h200-ort-cuda.yaml $LIB
    python3 bench/launch_drift.py --provider cuda --seconds "${1:-120}" --target $LIB -o "$OUT/launch-drift.md" 2>&1 |
        grep -v "No registered plugin EP" ;;
peers)
    softsyn_install
    model=${1:-qwen3-1.7b}
    python3 bench/compare_peers.py --provider cuda --model "$model" --genai /tmp/genai/onnxruntime_genai-*.whl \
        --work /tmp/peers -o "$OUT/compare-peers-cuda-$model.md" 2>&1 | tee "$OUT/compare-peers-$model.log" |
        grep -v "No registered plugin EP"
    cp /tmp/peers/compiled/reports/fusion.rpt "$OUT/fusion-$model.rpt" 2>/dev/null || true ;;
peers4)
    softsyn_install
    dir=$1
    model=${2:-qwen3-1.7b}
    python3 bench/compare_peers.py --provider cuda --model "$model" --genai /tmp/genai/onnxruntime_genai-*.whl \
        --compiled-dir "$dir" --builder-precision int4 --variants compiled,compiled+graph,low,low+graph,plain,builder,builder+graph \
        --work /tmp/peers4 -o "$OUT/compare-peers-cuda-$model-$(basename "$dir")-int4.md" \
        --peers-json "$OUT/peers.json" 2>&1 | tee "$OUT/compare-peers4-$model.log" | grep -v "No registered plugin EP"
    # the builder's points on the compile's latency-error front, measured in the same run
    softsyn report pareto "$dir" --peers "$OUT/peers.json" > "$OUT/pareto-$(basename "$dir").rpt" || true
    cp "$dir/reports/pareto.json" "$OUT/pareto-$(basename "$dir").json" 2>/dev/null || true ;;
torchtiny)
    softsyn_install
    rm -rf /tmp/torch-tiny
    cons=constraints/chat-h200-torch.yaml
    if [ -n "${INT4:-}" ]; then  # an int4 map: every weight cell starts int4 and the budget keeps it
        sed 's/max_rel_error: .*/max_rel_error: 90%/; s/min_top1: .*/min_top1: 0%/' $cons > /tmp/torch-int4.yaml
        printf 'precision:\n  allowed: [fp16, int4]\n  default: int4\n' >> /tmp/torch-int4.yaml
        cons=/tmp/torch-int4.yaml
    fi
    set +e
    softsyn compile zoo:qwen3-tiny -c $cons -o /tmp/torch-tiny -q > "$OUT/torch-tiny-compile.log" 2>&1
    echo "compile exit $?"; grep "target h200-torch" "$OUT/torch-tiny-compile.log"
    softsyn verify /tmp/torch-tiny 2>&1 | tail -8
    softsyn run /tmp/torch-tiny --gen 16 2>&1 | tail -12
    set -e ;;
torchkernels)
    softsyn_install
    python3 -u bench/torch_kernels.py "$@" -o "$OUT/torch-kernels.md" 2>&1 | tee "$OUT/torch-kernels.log" \
        | grep -v "No registered plugin EP" | tail -20 ;;
script)
    # one of bench/'s CUDA checks with a main by name (attention_step_check.py) with softsyn installed
    softsyn_install
    (cd bench && python3 -u "$@") 2>&1 | grep -v "No registered plugin EP" | tee "$OUT/$1.log" | tail -30 ;;
torchonly)
    # one call on a fresh machine: the torch targets need no onnxruntime-gpu (the image's CPU build imports), so the
    # 255 MB wheel's seven calls are skipped; the wheels' packages and softsyn, then STEP as usual
    stage_wheels
    python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/whl/*.whl
    softsyn_install
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    TORCH_ONLY=1 exec bash "$0" "$@" ;;
warm)
    # the export cache filled (softsyn analyze: export, materialised weights), so that a `torch` step in the next call
    # on this warm machine spends its limit on the packages (qwen3-1.7b: ~95 s of export a fresh machine pays first)
    softsyn_install
    timeout "${2:-300}" softsyn analyze zoo:${1:-qwen3-1.7b} -c "${CONS:-constraints/chat-h200-torch.yaml}" 2>&1 \
        | grep "^\[softsyn\]" | tail -5
    # analyze reads the weightless export; a compile materialises seeded weights too (qwen3-1.7b: 78 s on the H200,
    # 2026-12-06, which ran a 585 s torch step out of time): fill that cache entry as well
    timeout "${2:-300}" python3 -c "from softsyn.frontends import read_design; read_design('zoo:${1:-qwen3-1.7b}', materialize=True)" \
        2>&1 | grep "^\[softsyn\]" | tail -2 ;;
torch)
    softsyn_install
    model=${1:-qwen3-1.7b}
    name=torch-$model${TAG:+-$TAG}  # TAG=int4: /tmp/torch-MODEL-int4, beside the fp16 artifact
    rm -rf /tmp/$name
    set +e
    timeout "${2:-585}" softsyn --debug compile zoo:$model -c "${CONS:-constraints/chat-h200-torch.yaml}" -o /tmp/$name \
        > "$OUT/$name-compile.txt" 2>&1
    code=$?
    set -e
    torch_results "$name" "$OUT/$name-compile.txt" $code ;;
torchbg)
    # the compile detached from the call (setsid: the call's end does not stop it), so a model whose compile outlasts
    # one call's limit finishes across calls while the machine stays warm; this call waits up to S seconds for it
    softsyn_install
    model=${1:-qwen3-1.7b}
    name=torch-$model${TAG:+-$TAG}
    rm -rf /tmp/$name /tmp/$name.code
    : > /tmp/$name.log  # there before the detached shell opens it: torch_wait checks for it
    setsid nohup bash -c "softsyn --debug compile zoo:$model -c '${CONS:-constraints/chat-h200-torch.yaml}' \
        -o /tmp/$name > /tmp/$name.log 2>&1; echo \$? > /tmp/$name.code" > /dev/null 2>&1 < /dev/null &
    torch_wait "$name" "${2:-560}" ;;
torchwait)
    torch_wait "torch-${1:-qwen3-1.7b}${TAG:+-$TAG}" "${2:-580}" ;;
torchsignoff)
    softsyn_install
    set +e  # a violated group exits 1: the report still comes back
    softsyn signoff "$1" --provider cuda 2>&1 | grep -v "No registered plugin EP" | tee "$OUT/torch-signoff.rpt" | tail -60
    if [ "${VERIFY:-1}" != 0 ]; then
        softsyn verify "$1" 2>&1 | grep -v "No registered plugin EP" > "$OUT/torch-verify.txt"
        echo "softsyn verify $1: exit ${PIPESTATUS[0]}"; grep -E "logits|VIOLATED|^MET" "$OUT/torch-verify.txt"
    fi
    set -e ;;
peerst)
    softsyn_install
    dir=$1
    model=${2:-qwen3-1.7b}
    python3 bench/compare_peers.py --provider cuda --model "$model" --genai /tmp/genai/onnxruntime_genai-*.whl \
        --torch-dir "$dir" --variants "${VARIANTS:-compiled,compiled+graph,torch,plain,builder,builder+graph}" \
        ${BUILDER:+--builder-precision $BUILDER} ${TORCH2:+--torch2-dir $TORCH2} --work /tmp/peerst -o "$OUT/compare-peers-cuda-$model-torch.md" --peers-json "$OUT/peers-torch.json" 2>&1 |
        tee "$OUT/compare-peerst-$model.log" | grep -v "No registered plugin EP"
    cp /tmp/peerst/compiled/reports/fusion.rpt "$OUT/fusion-$model.rpt" 2>/dev/null || true ;;
ttft)
    start=$SECONDS  # the call's clock (the device tool ends a call at 600 s)
    softsyn_install
    dir=${1:-/tmp/ttft-${MODEL:-qwen3-1.7b}}
    set +e  # a violated group exits 1: the artifact and the reports are still written
    if [ ! -f $dir/runtime/session.json ]; then
        rm -rf $dir
        timeout 450 softsyn compile "zoo:${MODEL:-qwen3-1.7b}" -c constraints/chat-h200.yaml --effort low -o $dir -q \
            > "$OUT/ttft-compile.log" 2>&1
        echo "compile exit $? after $((SECONDS - start)) s"
    fi
    if [ ! -f $dir/signoff/signoff.json ]; then
        [ $((SECONDS - start)) -gt 330 ] && { echo "call 'ttft' again for the signoff and the runs (it reuses $dir)"; exit 0; }
        timeout $((560 - (SECONDS - start))) softsyn signoff $dir --provider cuda -q 2>&1 | grep -v "No registered plugin EP" |
            tee "$OUT/ttft-signoff.txt" | sed -n '/Group  *Scenario/,/times in ms/p'
        echo "signoff exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
    fi
    # the same artifact with enable_cuda_graph off: whether a session set up for graph capture runs its eager prefill
    # slower than signoff's eager session does (signoff times the prefill in a session without it)
    if [ ! -f $dir-eager/runtime/session.json ]; then
        rm -rf $dir-eager && cp -r $dir $dir-eager && python3 - "$dir-eager/runtime/session.json" <<'PY'
import json, sys
path = sys.argv[1]
data = json.load(open(path))
for options in (data.get("provider_options") or {}).values():
    options.pop("enable_cuda_graph", None)
json.dump(data, open(path, "w"), indent=1)
PY
    fi
    n=0
    for run in "$dir --prompt-len 512 --gen 32" "$dir --prompt-len 4095 --gen 8" "$dir --prompt-len 512 --gen 32 --warmup 1" \
               "$dir-eager --prompt-len 512 --gen 32"; do
        [ $((n++)) -ge ${RUNS:-4} ] && break  # RUNS=2: the two runs at the signed-off steps only
        [ $((SECONDS - start)) -gt 520 ] && { echo "call 'ttft' again for: softsyn run $run"; break; }
        name=ttft-run-$(echo ${run#/tmp/} | tr -d ' -' | tr / _)
        timeout $((585 - (SECONDS - start))) softsyn run $run --provider cuda --runs 5 -q 2>&1 |
            grep -v "No registered plugin EP" > "$OUT/$name.txt"
        echo "softsyn run $run --provider cuda --runs 5: exit ${PIPESTATUS[0]}"
        sed -n '/Times in ms/,$p' "$OUT/$name.txt"
    done
    set -e ;;
tiny)
    softsyn_install
    rm -rf /tmp/tiny-h200
    softsyn compile zoo:qwen3-tiny -c constraints/tiny-h200.yaml --effort low -o /tmp/tiny-h200 -q > "$OUT/tiny-compile.log"
    grep -A3 provider_options /tmp/tiny-h200/runtime/session.json
    softsyn run /tmp/tiny-h200 --prompt-len 128 --gen 64 --runs 5 --provider cuda 2>&1 | tee "$OUT/tiny-run.txt" |
        grep -v "No registered plugin EP"
    softsyn signoff /tmp/tiny-h200 --provider cuda 2>&1 | tail -30 | grep -v "No registered plugin EP"
    cp /tmp/tiny-h200/reports/signoff.rpt "$OUT/tiny-signoff.rpt" 2>/dev/null || true ;;
qwen3next)
    softsyn_install
    rm -rf /tmp/qwen3-next-h200
    set +e  # exit 1 (a timing violation) still writes the artifact
    softsyn compile zoo:qwen3-next-tiny -c constraints/tiny-h200.yaml -o /tmp/qwen3-next-h200 -q > "$OUT/next-compile.log" 2>&1
    echo "compile exit $?"
    grep -A3 provider_options /tmp/qwen3-next-h200/runtime/session.json
    softsyn verify /tmp/qwen3-next-h200 --locate 2>&1 | tee "$OUT/next-verify.txt" | grep -v "No registered plugin EP" |
        sed -n '/^VIOLATED\|^verify:\|Located\|^  [a-z]/p' | tail -16
    set -e
    softsyn run /tmp/qwen3-next-h200 --prompt-len 128 --gen 32 --runs 5 --provider cuda 2>&1 | tee "$OUT/next-run.txt" |
        grep -v "No registered plugin EP"
    python3 - <<'EOF' 2>&1 | tee "$OUT/next-tokens.txt"
import sys, torch, onnx_ir as ir
sys.path.insert(0, "tests")
from softsyn.frontends import source_torch_model
from softsyn.runtime.decoder import decoder_io
from softsyn.runtime.generate import Generator, prompt_ids
from softsyn.runtime.session import open_model
prompt, path = prompt_ids(1024, 8, seed=1), "/tmp/qwen3-next-h200/model.onnx"
with torch.no_grad():
    hf = source_torch_model("zoo:qwen3-next-tiny", hybrid=True).generate(torch.from_numpy(prompt)[None], max_new_tokens=32,
                                                                          min_new_tokens=32, do_sample=False)[0, 8:].tolist()
ours = list(Generator(open_model(path, "cuda"), decoder_io(ir.load(path)), "cuda").generate(prompt, 32).tokens)
print("transformers fp32:", hf)
print("softsyn loop, cuda fp16:", ours, "identical" if ours == hf else "differs")
try:
    from genai_tokens import genai_tokens
    genai = genai_tokens(__import__("pathlib").Path("/tmp/qwen3-next-h200"), prompt, 32)
    print("onnxruntime-genai cuda:", genai, "identical" if genai == hf else "differs")
except ImportError as exc:
    print("onnxruntime-genai not installed:", exc)
EOF
    ;;
next80b)
    softsyn_install
    layers=${1:-2}
    python3 - "$layers" <<'EOF'
import json, pathlib, sys
from softsyn.frontends import zoo
layers = int(sys.argv[1])
cfg = zoo.make_config(zoo.ZOO["qwen3-next-80b-a3b"]).to_dict()
kinds = ["linear_attention", "full_attention"] if layers == 2 else (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)
cfg.update(num_hidden_layers=len(kinds), layer_types=kinds, architectures=["Qwen3NextForCausalLM"], torch_dtype="float16")
folder = pathlib.Path(f"/tmp/next80b-{len(kinds)}l")
folder.mkdir(exist_ok=True)
(folder / "config.json").write_text(json.dumps(cfg, indent=1))
print(folder, len(kinds), "layers:", kinds)
EOF
    sed 's/^area_constraint: .*/area_constraint: 141GB/' constraints/tiny-h200.yaml > /tmp/next80b.yaml
    rm -rf /tmp/next80b
    set +e  # a violated group exits 1 and still writes the artifact and reports
    timeout 420 softsyn compile /tmp/next80b-${layers}l/config.json -c /tmp/next80b.yaml --effort low -o /tmp/next80b \
        > "$OUT/next80b-compile.log" 2>&1
    echo "compile exit $?"
    grep -v "No registered plugin EP\|shape massaging" "$OUT/next80b-compile.log" | tail -25
    # --locate: a violated scenario is run node by node on CUDA and CPU (the 12-03 prefill error was not located)
    softsyn verify /tmp/next80b --locate 2>&1 | grep -v "No registered plugin EP" | tee "$OUT/next80b-verify.txt" |
        tail -14
    softsyn signoff /tmp/next80b --provider cuda 2>&1 | grep -v "No registered plugin EP\|shape massaging" | tail -30
    set -e
    cp /tmp/next80b/reports/signoff.rpt "$OUT/next80b-signoff.rpt" 2>/dev/null || true ;;
locate)
    # verify --locate on a CUDA artifact (DIR, default the qwen3-next tiny compiled here first): the nodes whose CUDA
    # values depart from the CPU run of the same model while their inputs agree
    softsyn_install
    dir=${1:-/tmp/qwen3-next-h200}
    [ -n "${1:-}" ] && [ ! -f $dir/runtime/session.json ] && { echo "locate: $dir is no compiled artifact (run its step first)"; exit 2; }
    set +e  # a compile that misses a clock exits 1 and still writes the artifact
    if [ ! -f $dir/runtime/session.json ]; then
        softsyn compile zoo:qwen3-next-tiny -c constraints/tiny-h200.yaml -o $dir -q > "$OUT/locate-compile.log" 2>&1
        echo "compile exit $?"
    fi
    softsyn verify $dir --locate 2>&1 | grep -v "No registered plugin EP" | tee "$OUT/locate-$(basename $dir).txt" | tail -40
    set -e ;;
kvint8)
    softsyn_install
    python3 bench/kv_int8.py --provider cuda -o "$OUT/kv-int8-h200.json" 2>&1 | grep -v "No registered plugin EP"
    rm -rf /tmp/tiny-h200-int8
    sed 's/dtype: fp16/dtype: int8/' constraints/tiny-h200.yaml > /tmp/tiny-h200-int8.yaml
    softsyn compile zoo:qwen3-tiny -c /tmp/tiny-h200-int8.yaml --effort low -o /tmp/tiny-h200-int8 -q \
        > "$OUT/tiny-int8-compile.log" || true
    set +e
    softsyn verify /tmp/tiny-h200-int8 2>&1 | tail -16 | grep -v "No registered plugin EP"
    softsyn run /tmp/tiny-h200-int8 --prompt-len 128 --gen 64 --runs 5 --provider cuda 2>&1 |
        tee "$OUT/tiny-int8-run.txt" | tail -8 | grep -v "No registered plugin EP"
    softsyn signoff /tmp/tiny-h200-int8 --provider cuda 2>&1 | tail -30 | grep -v "No registered plugin EP"
    set -e
    cp /tmp/tiny-h200-int8/reports/signoff.rpt "$OUT/tiny-int8-signoff.rpt" 2>/dev/null || true ;;
loop)
    # in the foreground: the device tool ends a call's processes with the call (a nohup'd compile of 2026-12-01 died
    # at its call's end), so the compile has one call (timeout S, 580) and `signoff NAME` the next
    softsyn_install
    cons=${1:-constraints/chat-h200-int4.yaml}
    # BUDGET=90%: the constraints' accuracy budget replaced (the file copied to /tmp under the same stem)
    if [ -n "${BUDGET:-}" ]; then
        sed "s/max_rel_error: .*/max_rel_error: $BUDGET/" "$cons" > "/tmp/$(basename "$cons")"; cons="/tmp/$(basename "$cons")"
    fi
    effort=${EFFORT:-ultra}
    name=$(basename "$cons" .yaml)${EFFORT:+-$EFFORT}
    rm -rf /tmp/$name
    set +e
    timeout "${2:-580}" softsyn compile zoo:${MODEL:-qwen3-1.7b} -c "$cons" --effort "$effort" -o /tmp/$name \
        > "$OUT/$name-compile.txt" 2>&1
    echo "compile exit $?"
    set -e
    grep -v "No registered plugin EP\|shape massaging" "$OUT/$name-compile.txt" | tail -60
    cp /tmp/$name/reports/precision.rpt "$OUT/$name-precision.rpt" 2>/dev/null || true
    cp /tmp/$name/compile.log "$OUT/$name-compile.log" 2>/dev/null || true
    cp /tmp/$name/reports/pareto.rpt "$OUT/$name-pareto.rpt" 2>/dev/null || true ;;
bf16)
    softsyn_install
    [ -f $LIB ] || cp softsyn/library/libs/h200-ort-cuda.yaml $LIB
    start=$SECONDS
    if ! grep -A1 "op: SimplifiedLayerNormalization$" $LIB | grep -q "precision: bf16"; then
        set +e
        timeout 240 bash -c "softsyn characterize --runtime ort --provider cuda \
            --cells 'SimplifiedLayerNormalization.bf16,SkipSimplifiedLayerNormalization.bf16' -o $LIB &&
            softsyn characterize --runtime ort --provider cuda --graph --cells 'MatMul.bf16' -o $LIB" 2>&1 |
            tr '\r' '\n' | grep -v "No registered plugin EP\|: pass 1/1 point" | tail -12
        set -e
        cp $LIB "$OUT/h200-ort-cuda.yaml"
        cp $LIB $LIB.graph
        cp $LIB softsyn/library/libs/h200-ort-cuda.yaml  # the compile below times with the new cells
    fi
    cons=${CONS:-constraints/chat-h200-fp8-bf16.yaml}
    name=$(basename "$cons" .yaml)
    if [ -n "${BUDGET:-}" ]; then
        sed "s/max_rel_error: .*/max_rel_error: $BUDGET/" "$cons" > "/tmp/$(basename "$cons")"; cons="/tmp/$(basename "$cons")"
    fi
    rm -rf /tmp/$name
    set +e
    timeout $(( ${1:-540} - (SECONDS - start) )) softsyn compile zoo:${MODEL:-qwen3-1.7b} -c "$cons" \
        --effort "${EFFORT:-medium}" -o /tmp/$name > "$OUT/$name-compile.txt" 2>&1
    echo "compile exit $?"
    grep -v "No registered plugin EP\|shape massaging" "$OUT/$name-compile.txt" | grep "bf16\|fp8\|fallback\|start:\|WNS" | tail -24
    softsyn verify /tmp/$name 2>&1 | grep -v "No registered plugin EP" | tee "$OUT/$name-verify.txt" | tail -14
    set -e
    python3 -c "import json; print(json.dumps(json.load(open('/tmp/$name/runtime/session.json'))['precision_map'], indent=1))" \
        > "$OUT/$name-precision-map.json" 2>/dev/null || true
    cp /tmp/$name/reports/precision.rpt "$OUT/$name-precision.rpt" 2>/dev/null || true
    cp /tmp/$name/compile.log "$OUT/$name-compile.log" 2>/dev/null || true ;;
signoff)
    softsyn_install
    set +e  # a violated group exits 1: the report still comes back
    softsyn signoff /tmp/$1 --provider cuda 2>&1 | grep -v "No registered plugin EP\|shape massaging" | tail -40
    set -e
    cp /tmp/$1/reports/signoff.rpt "$OUT/$1-signoff.rpt" 2>/dev/null || true ;;
sensitivity)
    softsyn_install
    python3 bench/sensitivity.py "${1:-zoo:qwen3-1.7b}" -c "${2:-constraints/chat-h200-int4.yaml}" --mode role 2>&1 |
        grep -v "No registered plugin EP" | tee "$OUT/sensitivity-role.txt" | tail -30 ;;
moecells)
    softsyn_install
    cp softsyn/library/libs/h200-ort-cuda.yaml $LIB
    set +e
    quick=--quick; [ -n "${FULL:-}" ] && quick=
    timeout "${1:-300}" softsyn characterize --runtime ort --provider cuda $quick --cells 'MoE*,QMoE*' -o $LIB 2>&1 |
        tail -20 | grep -v "No registered plugin EP"
    set -e
    cp $LIB "$OUT/h200-ort-cuda.yaml" ;;
moe)
    softsyn_install
    python3 bench/moe_cuda.py -o "$OUT/moe-cuda.md" 2>&1 | tail -40 | grep -v "No registered plugin EP" ;;
qmoe)
    softsyn_install
    # tee first: a call cut at its limit (2026-12-03: 420 s, nothing came back through tail) still returns its log
    set +e
    timeout "${1:-560}" python3 bench/moe_cuda.py --only 30b --layers 2 --forms fp16,qmoe -o "$OUT/moe-qmoe-cuda.md" 2>&1 |
        grep -v "No registered plugin EP" | tee "$OUT/moe-qmoe.log" | tail -40
    set -e ;;
moeprobe)
    softsyn_install
    python3 bench/moe_probe.py --provider cuda -o "$OUT/moe-probe-cuda.md" 2>&1 | grep -v "No registered plugin EP" ;;
families)
    softsyn_install
    python3 bench/family_signoff.py --provider cuda -o "$OUT/family-signoff-cuda.md" 2>&1 | tail -40 ;;
serving)
    start=$SECONDS  # the call's clock (the device tool ends a call at 600 s)
    softsyn_install
    cons=${1:-constraints/serving-h200.yaml}
    args=(--provider cuda --model "zoo:${MODEL:-qwen3-1.7b}" --constraints "$cons" --work /tmp/serving)
    python3 bench/host_probe.py --provider cuda --library softsyn/library/libs/h200-ort-cuda.yaml \
        2>&1 | grep -v "No registered plugin EP" | tee "$OUT/serving-host-cuda.yaml"
    cp softsyn/library/libs/h200-ort-cuda.yaml "$OUT/h200-ort-cuda.yaml"
    set +e
    timeout 540 python3 bench/serving_validate.py "${args[@]}" --compile-only 2>&1 |
        grep -v "No registered plugin EP" | tee "$OUT/serving-compile.log" | tail -5
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" = 0 ] || { echo "serving_validate --compile-only exit $rc (log: serving-compile.log)"; exit 1; }
    left=$((570 - (SECONDS - start) - 60))  # 60 s: loading the 1.7B session and the tail of the trace
    secs=${2:-240}
    [ "$left" -lt "$secs" ] && secs=$left
    if [ "$secs" -lt 90 ]; then
        echo "compiled in $((SECONDS - start)) s; call 'serving' again for the measurements (it reuses /tmp/serving)"
        exit 0
    fi
    set +e
    timeout $((585 - (SECONDS - start))) python3 bench/serving_validate.py "${args[@]}" --seconds "$secs" --past "${PAST:-320,1536}" --runs 100 ${EAGER:+--eager} \
        -o "$OUT/serving-validate-cuda.md" 2>&1 | grep -v "No registered plugin EP" | tee "$OUT/serving-validate.log" |
        tail -70
    echo "serving_validate exit ${PIPESTATUS[0]}"
    set -e
    cp /tmp/serving/*/compile.log "$OUT/serving-artifact-compile.log" 2>/dev/null || true ;;
vl)
    start=$SECONDS  # the call's clock (the device tool ends a call at 600 s)
    softsyn_install
    dir=/tmp/vl-h200
    set +e  # a violated group exits 1: the artifact and the reports are still written
    if [ ! -f $dir/runtime/session.json ]; then
        rm -rf $dir $dir.verified
        timeout "${1:-330}" softsyn compile zoo:qwen3-vl-2b-reduced -c constraints/vl-h200.yaml -o $dir \
            > "$OUT/vl-compile.txt" 2>&1
        echo "compile exit $? after $((SECONDS - start)) s"
    else
        echo "reusing $dir (compiled by an earlier call)"
    fi
    grep -v "No registered plugin EP" "$OUT/vl-compile.txt" 2>/dev/null | grep -B2 -A10 "ELAPSED"
    cp $dir/compile.log "$OUT/vl-compile.log" 2>/dev/null
    if [ ! -f $dir.verified ]; then
        timeout $((560 - (SECONDS - start))) softsyn verify $dir 2>&1 | grep -v "No registered plugin EP" |
            tee "$OUT/vl-verify.txt" | tail -4
        [ "${PIPESTATUS[0]}" = 0 ] && touch $dir.verified
        echo "verify done after $((SECONDS - start)) s"
    fi
    left=$((570 - (SECONDS - start)))
    if [ "$left" -lt 120 ]; then
        echo "$left s left: call 'vl' again for the signoff (it reuses $dir)"
        exit 0
    fi
    timeout $left softsyn signoff $dir --provider cuda 2>&1 | grep -v "No registered plugin EP" |
        tee "$OUT/vl-signoff.txt" | sed -n '/Group  *Scenario/,/times in ms/p'
    echo "signoff exit ${PIPESTATUS[0]} after $((SECONDS - start)) s"
    set -e
    cp $dir/reports/signoff.rpt "$OUT/vl-signoff.rpt" 2>/dev/null || true ;;
correlation)
    softsyn_install
    [ -f $LIB ] || cp softsyn/library/libs/h200-ort-cuda.yaml $LIB
    name=$(echo "$@" | tr ' ' '_')
    python3 bench/correlation.py --provider cuda --models "$@" --target $LIB --runs 60 --work /tmp/corr \
        -o "$OUT/correlation-cuda-$name.md" 2>&1 | tee "$OUT/correlation-$name.log"
    # what came out, with each model's graph (model.onnx without its weights) so the analysis can be re-run here
    for m in "$@"; do
        d=/tmp/corr/$m-cuda
        [ -f $d/design.json ] || continue
        cp "$(python3 -c "import json; print(json.load(open('$d/design.json'))['onnx'])")" $d/model-graph.onnx
    done
    tar czf "$OUT/corr-$name.tgz" -C /tmp/corr --exclude='*.data' $(for m in "$@"; do echo "$m-cuda"; done)
    ls -la "$OUT" ;;
*)
    echo "unknown step $step" >&2; exit 2 ;;
esac
