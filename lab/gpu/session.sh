#!/usr/bin/env bash
# One GPU session on the lent machine: tests under the installed Triton and under Triton 2.2,
# then the benchmarks, logs under $OUT. Run from the repository root:
#   TESTS="packages/fused-rope/tests" BENCH="packages/fused-rope/benchmarks" \
#     bash lab/gpu/session.sh tests3 tests22 bench
# Steps: tests3 (= small3 gpu3), tests22 (= small22 gpu22), bench.
# TESTS / BENCH default to every package; BENCH_K selects benchmarks by pytest -k. Tests that fit beside each other run in XDIST (default
# 8) processes, compiling in parallel; the `gpu`-marked ones (large shapes) in XDIST_GPU (default
# 2) so that they do not run out of memory together; the benchmarks always run alone. Carried in .carry/ (never committed): triton22-cp312.tar.xz
# (a stripped Triton 2.2.0 for Python 3.12, unpacked to /tmp/t22) and wheels (*.whl, e.g.
# liger-kernel) installed to /tmp/site.
set -uo pipefail
OUT=${OUT:-/tmp/out}
TESTS=${TESTS:-$(ls -d packages/*/tests)}
BENCH=${BENCH:-$(ls -d packages/*/benchmarks)}
XDIST=${XDIST:-8}
XDIST_GPU=${XDIST_GPU:-2}
# Seconds each pytest run may take (the lent machine's calls are time-limited): a run cut short
# still leaves its per-test log lines and, for benchmarks, the rows measured so far.
STAGE_TIMEOUT=${STAGE_TIMEOUT:-0}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 TRITONFORMER_BENCH_ROWS="$OUT/bench_rows.jsonl"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"

if ls .carry/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -f .carry/triton22-cp312.tar.xz ] && [ ! -d /tmp/t22/triton ]; then
  mkdir -p /tmp/t22 && tar -xJf .carry/triton22-cp312.tar.xz -C /tmp/t22
  # A wheel unpacked with Python's zipfile loses the executable bits that Triton's ptxas needs.
  chmod +x /tmp/t22/triton/third_party/cuda/bin/* 2>/dev/null
fi

# One pytest run of the suite: `small` (small shapes, many processes) or `gpu` (the `gpu`-marked
# large shapes, few processes); AOT compiling is the CPU machines' job.
# $1: log name; $2: small|gpu; the rest: extra environment.
run_suite() {
  local log=$1 part=$2; shift 2
  local marks="not aot and not gpu" procs=$XDIST
  if [ "$part" = gpu ]; then marks="gpu"; procs=$XDIST_GPU; fi
  # shellcheck disable=SC2086
  timeout "$STAGE_TIMEOUT" env "$@" python3 -m pytest -v -n "$procs" -m "$marks" --durations=8 $TESTS 2>&1 \
    | tee "$OUT/$log-$part.log" | grep -E " passed| failed|FAILED|ERROR|s call|s setup" | tail -40
  echo "$log $part: $(grep -c ' PASSED ' "$OUT/$log-$part.log") PASSED lines"
}

T22="PYTHONPATH=/tmp/t22${PYTHONPATH:+:$PYTHONPATH}"
for step in "$@"; do
  [ "$STAGE_TIMEOUT" = 0 ] || echo "== $step (each run at most ${STAGE_TIMEOUT}s) =="
  case "$step" in
    tests3) run_suite tests-3x small; run_suite tests-3x gpu ;;
    small3|gpu3) run_suite tests-3x "${step%3}" ;;
    tests22) run_suite tests-22 small "$T22"; run_suite tests-22 gpu "$T22" ;;
    small22|gpu22) run_suite tests-22 "${step%22}" "$T22" ;;
    bench)
      # shellcheck disable=SC2086
      timeout "$STAGE_TIMEOUT" python3 -m pytest -q -p no:xdist $BENCH ${BENCH_K:+-k "$BENCH_K"} --bench-table "$OUT/bench.md" 2>&1 \
        | tee "$OUT/bench.log" | grep -E " passed| failed|FAILED|ERROR" | tail -20
      PYTHONPATH=tools/testkit/src python3 lab/gpu/rows_to_tables.py "$OUT/bench_rows.jsonl" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
