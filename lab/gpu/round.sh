#!/usr/bin/env bash
# One lent-GPU call: a smoke pass of the test suite compiled, the host group, the norm rows, the
# model steps (eager, CUDA-graph, the twin under torch.compile). Logs and tables under $OUT.
# Stages: any of tests gpu host norms model model410 decode generate decode_step hf hf_liger hf_qwen2 hf_padded hf_gemma2
# hf_profile hf_ops hf_tests numerics features attn_ws attn_hopper attn_hopper_variants attn_gluon attn_order block_order hf_qwen2_profile pdl_chain colgemv gemv_sweep decode_sweep prefetch decode_ab rope_step bench_decode lce attn_pingpong decode_norm (default: tests host
# norms model).
# GPU_TESTS picks the gpu stage's test paths (a fresh machine compiles the whole set in more than one call)., each capped by its own timeout.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$(ls -d packages/*/src | tr "\n" ":")runtime:tools/testkit/src
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 TRITONFORMER_BENCH_ROWS="$OUT/rows.jsonl"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
if ls .carry/*.whl >/dev/null 2>&1; then
  # A folder of its own: /tmp/site may hold other packages from earlier calls on this machine.
  rm -rf /tmp/round-site && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/round-site .carry/*.whl
  export PYTHONPATH=/tmp/round-site:$PYTHONPATH
fi
for stage in ${@:-tests host norms model}; do
  echo "== $stage $(date +%T)"
  case "$stage" in
    tests) timeout "${T_TESTS:-150}" python3 -m pytest -q -x -n 16 -m "not aot and not gpu" runtime/tests packages/*/tests \
             -p no:randomly 2>&1 | tee "$OUT/tests.log" | tail -15 ;;
    # -v: a run cut by its timeout still logs every test it finished (pytest's summary comes last).
    gpu) timeout "${T_GPU:-200}" python3 -m pytest -v -n 8 --dist loadfile -m gpu -rfE --tb=short \
           ${GPU_TESTS:-runtime/tests packages/*/tests} -p no:randomly 2>&1 | grep -v "Benchmark\|warner" \
           > "$OUT/gpu.log"; grep -c PASSED "$OUT/gpu.log"; grep -E "FAILED|ERROR" "$OUT/gpu.log" | head -20 ;;
    hf) timeout "${T_HF:-200}" python3 -m tritonformer.bench --providers hf-llama hf-llama+liger hf-llama+tritonformer \
          --config llama-1.4B:2048:4 --out-dir "$OUT/hf" 2>&1 | tail -8 ;;
    # Gemma-2 at the 1.4B shape: HF's eager softcapped attention against the kernels and Liger's.
    hf_gemma2) timeout "${T_HF:-300}" python3 -m tritonformer.bench --providers hf-gemma2 hf-gemma2+tritonformer \
                 hf-gemma2+liger --config llama-1.4B:2048:4 --out-dir "$OUT/hf_gemma2" 2>&1 | tail -8 ;;
    # The HF patch's and the kernels' GPU tests that the HF step's changes touch, failures in full.
    hf_tests) timeout "${T_HF_TESTS:-180}" python3 -m pytest -q -n 8 -p no:randomly -rfE --tb=long \
                packages/fused-swiglu/tests/test_mlp.py packages/fused-swiglu/tests/test_swiglu.py \
                packages/fused-norm-xent/tests/test_norm.py packages/tritonformer-model/tests/test_hf_patch.py \
                packages/fused-swiglu/tests/test_dispatch.py \
                -k "${HF_TESTS_K:-gelu or in_place or views or out_dtype or autocast or feed or marks or rope or fp32_matches or tma_forward or fused_loss}" \
                2>&1 | tee "$OUT/hf_tests.log" | tail -8 ;;
    # The aten ops of the HF Llama 1.4B step patched by us, by self CUDA time and input shapes.
    hf_ops) timeout "${T_HF_OPS:-120}" python3 lab/gpu/hf_step_ops.py llama-1.4B:2048:4 hf-llama+tritonformer \
              > "$OUT/hf_ops.md" 2>&1; head -60 "$OUT/hf_ops.md" ;;
    hf_liger) timeout "${T_HF:-200}" python3 -m tritonformer.bench --providers hf-llama+liger hf-llama+tritonformer \
                --config llama-1.4B:2048:4 --out-dir "$OUT/hf" 2>&1 | grep "^| llama" ;;
    numerics) timeout "${T_NUMERICS:-90}" python3 lab/gpu/numerics_diag.py $NUMERICS > "$OUT/numerics.md" 2>&1
              tail -16 "$OUT/numerics.md" ;;
    # The same with GQA (4 KV heads) in Qwen2, and Llama fine-tuning batches with right padding.
    hf_qwen2) timeout "${T_HF:-200}" python3 -m tritonformer.bench --providers hf-qwen2+liger hf-qwen2+tritonformer \
                --config llama-1.4B:2048:4 --set n_kv_head=4 --out-dir "$OUT/hf_qwen2" 2>&1 | grep "^| llama" ;;
    hf_padded) for side in right left; do timeout "${T_HF:-200}" python3 -m tritonformer.bench --providers \
                 hf-llama+liger hf-llama+tritonformer --config llama-1.4B:2048:4 --padding $side \
                 --out-dir "$OUT/hf_padded_$side" 2>&1 | grep "^| llama"; done ;;
    # Kernel time of the HF Llama 1.4B step, patched by us and by Liger, beside our own model's.
    hf_profile) timeout "${T_HF_PROFILE:-220}" python3 lab/gpu/model_bubbles.py llama-1.4B:2048:4 hf-llama+tritonformer \
                  hf-llama+liger tritonformer 2>&1 | tee "$OUT/hf_profile.md" ;;
    # Triton's automatic warp specialization on minimal attention kernels, against the package and cuDNN.
    attn_ws) timeout "${T_ATTN_WS:-300}" python3 lab/gpu/attn_ws_lab.py ${ATTN_WS:-} 2>&1 | tee "$OUT/attn_ws.md" | grep -v "^|  |" ;;
    # The Gluon lab kernels (forward, dK/dV, dQ) against the package's (Hopper, Triton 3.6).
    # fused-attention's backward with the Hopper dK/dV kernel and with the portable one, cuDNN beside.
    attn_hopper) timeout "${T_ATTN_HOPPER:-300}" python3 lab/gpu/attn_hopper_ab.py 2>&1 | tee "$OUT/attn_hopper.md" ;;
    attn_hopper_variants) timeout "${T_ATTN_HOPPER:-300}" python3 lab/gpu/attn_hopper_variants.py 2>&1 \
                            | tee "$OUT/attn_hopper_variants.md" ;;
    # The warp-specialized (two consumer warpgroups, a TMA loader) Gluon forward against the package's and cuDNN's.
    attn_pingpong) timeout "${T_ATTN_PINGPONG:-420}" python3 lab/gpu/attn_pingpong_lab.py 2>&1 | tee "$OUT/attn_pingpong.md" ;;
    attn_gluon) timeout "${T_ATTN_GLUON:-540}" python3 lab/gpu/attn_gluon_lab.py 2>&1 | tee "$OUT/attn_gluon.md" ;;
    # The attention kernels against lab versions of their files, configs pinned: ATTN_AB="FWD_PY BWD_PY"
    # (copies of kernels/attention_fwd.py and attention_bwd.py, carried under .carry/ab).
    attn_order) timeout "${T_ATTN_ORDER:-300}" python3 lab/gpu/attn_order_ab.py ${ATTN_AB:?ATTN_AB names the two lab files} \
                  2>&1 | tee "$OUT/attn_order.md" ;;
    # The HF Qwen2 (4 KV heads) step with fused-attention's GQA grids block-major and head-major, alternating.
    block_order) LAB_SET="n_kv_head=4" timeout "${T_BLOCK_ORDER:-300}" python3 lab/gpu/block_order_step.py \
                   llama-1.4B:2048:4 hf-qwen2+tritonformer 2>&1 | tee "$OUT/block_order.md" | grep "^|" ;;
    # Kernel time of the HF Qwen2 (4 KV heads) 1.4B step, patched by us and by Liger.
    hf_qwen2_profile) BUBBLES_TOP=30 LAB_SET="n_kv_head=4" timeout "${T_HF_PROFILE:-220}" python3 lab/gpu/model_bubbles.py \
                        llama-1.4B:2048:4 hf-qwen2+tritonformer hf-qwen2+liger 2>&1 | tee "$OUT/hf_qwen2_profile.md" ;;
    host) timeout "${T_HOST:-150}" python3 -m pytest -q -p no:xdist packages/*/benchmarks/bench_host.py \
            --bench-table "$OUT/host.md" 2>&1 | tail -3 ;;
    bench_decode) timeout "${T_BENCH_DECODE:-150}" python3 -m pytest -q -p no:xdist \
                    packages/fused-attention/benchmarks/bench_decode.py --bench-table "$OUT/bench_decode.md" 2>&1 | tail -3 ;;
    # Linear + cross-entropy in its three weight_grad modes: the GPU tests, then time and memory with Liger.
    lce) timeout "${T_LCE_TESTS:-150}" python3 -m pytest -q -n 4 -p no:randomly -rfE --tb=short \
           packages/fused-norm-xent/tests/test_linear_cross_entropy.py 2>&1 | tee "$OUT/lce_tests.log" | tail -4
         timeout "${T_LCE:-300}" python3 -m pytest -q -p no:xdist packages/fused-norm-xent/benchmarks/bench_linear_cross_entropy.py \
           --bench-table "$OUT/lce.md" 2>&1 | tail -3 ;;
    norms) timeout "${T_NORMS:-100}" python3 -m pytest -q -p no:xdist packages/fused-norm-xent/benchmarks/bench_norms.py \
             -k "test_norm and not compile" --bench-table "$OUT/norms.md" 2>&1 | tail -3 ;;
    # Programmatic dependent launch on a synthetic batch-1 decode chain (plain / PDL / PDL + weight prefetch).
    pdl_chain) timeout "${T_PDL:-120}" python3 lab/gpu/pdl_chain.py 2>&1 | tee "$OUT/pdl_chain.md" ;;
    # Batch-1 decode products over input-major weights (fused-swiglu's gate/up and down): split-K column GEMVs vs anchors.
    colgemv) timeout "${T_COLGEMV:-300}" python3 lab/gpu/colgemv_lab.py 2>&1 | tee "$OUT/colgemv.md" | grep "best\|cuBLAS\|fused_swiglu" ;;
    # The same for row-major weights (fused-gemm's GEMV against its portable tiles and cuBLAS).
    gemv_sweep) timeout "${T_GEMV:-120}" python3 lab/gpu/gemv_sweep.py 2>&1 | tee "$OUT/gemv_sweep.md" | grep "best\|cuBLAS\|package" ;;
    decode) timeout "${T_DECODE:-120}" python3 lab/gpu/decode_bench.py 2>&1 | tee "$OUT/decode.md" ;;
    # The decode kernel against the fused-attention in .carry/olddecode (a `git archive` of the
    # package and runtime before the change), alternating, each a process of its own.
    decode_ab) for i in 1 2; do for v in old new; do
                 extra=""; [ "$v" = old ] && extra="$PWD/.carry/olddecode/packages/fused-attention/src:"
                 echo "-- $v $i" | tee -a "$OUT/decode_ab.md"
                 PYTHONPATH="$extra$PYTHONPATH" timeout 90 python3 lab/gpu/decode_bench.py 2>&1 | tee -a "$OUT/decode_ab.md" | tail -4
                 PYTHONPATH="$extra$PYTHONPATH" DECODE_LAB_MODELS=ours timeout 150 python3 lab/gpu/decode_lab.py step 2>&1 \
                   | grep "^|\|###" | tee -a "$OUT/decode_ab.md" | grep "###\|decode"
               done; done ;;
    # RoPE inside the decode kernel in the 1.4B decode step: shipped / fused fp32 tables / bf16 tables.
    rope_step) timeout "${T_ROPE_STEP:-240}" python3 lab/gpu/rope_fused_step.py 2>&1 | tee "$OUT/rope_step.md" | tail -9 ;;
    # Upper bound of folding the decode step's add + norm kernels into the products after them.
    decode_norm) timeout "${T_DECODE_NORM:-200}" python3 lab/gpu/decode_norm_bound.py 2>&1 | tee "$OUT/decode_norm.md" | tail -6 ;;
    prefetch) timeout "${T_PREFETCH:-300}" python3 lab/gpu/prefetch_lab.py 2>&1 | tee "$OUT/prefetch.md" | tail -12 ;;
    decode_sweep) timeout "${T_DECODE_SWEEP:-400}" python3 lab/gpu/decode_bench.py sweep 2>&1 | tee "$OUT/decode_sweep.md" \
                    | tail -3 ;;
    # Softcap, dropout, GeGLU compiled: their GPU tests, then their cost with anchors.
    features) timeout "${T_FEATURES:-240}" python3 -m pytest -q -n 8 -p no:randomly -rfE --tb=short \
                packages/fused-attention/tests packages/fused-norm-xent/tests packages/fused-swiglu/tests \
                packages/tritonformer-model/tests/test_hf_patch.py \
                -k "softcap or dropout or gemma or gelu" 2>&1 | tee "$OUT/features_tests.log" | tail -8
              timeout "${T_FEATURES_COST:-240}" python3 lab/gpu/features_cost.py 2>&1 | tee "$OUT/features.md" ;;
    # The generation rows with their anchors (the 1.4B first), then where the batch-1 step goes.
    generate) timeout "${T_GENERATE:-420}" python3 -m tritonformer.bench --generate --presets llama-1.4B llama-410M \
                llama-160M --providers tritonformer+graph torch.compile hf-llama --out-dir "$OUT/gen" 2>&1 | grep "^|" ;;
    decode_step) DECODE_LAB_MODELS=ours,compiled timeout "${T_DECODE_STEP:-200}" python3 lab/gpu/decode_lab.py step \
                   attention_small 2>&1 | grep "^|\|###" | tee "$OUT/decode_step.md" ;;
    model410) timeout "${T_MODEL:-150}" python3 -m tritonformer.bench --providers tritonformer tritonformer+graph \
             --config 410M:2048:8 --out-dir "$OUT/model" 2>&1 | tail -6 ;;
    model) timeout "${T_MODEL:-200}" python3 -m tritonformer.bench --providers tritonformer tritonformer+graph torch.compile \
             --config 410M:2048:8 llama-1.4B:2048:4 --out-dir "$OUT/model" 2>&1 | tail -12 ;;
  esac
done
PYTHONPATH=tools/testkit/src python3 lab/gpu/rows_to_tables.py "$OUT/rows.jsonl" > "$OUT/tables.md" 2>/dev/null
cat "$OUT/tables.md" | grep -A40 "### host" | head -60
