#!/usr/bin/env bash
# One GPU session on the lent machine: tests under the installed Triton and under Triton 2.2,
# then the benchmarks, logs under $OUT. Run from the repository root:
#   TESTS="packages/fused-rope/tests" BENCH="packages/fused-rope/benchmarks" \
#     bash tools/gpu/session.sh tests3 tests22 bench
# TESTS / BENCH default to every package. Tests that fit beside each other run in XDIST (default
# 8) processes, compiling in parallel; the `gpu`-marked ones (large shapes) in XDIST_GPU (default
# 2) so that they do not run out of memory together; the benchmarks always run alone. Carried in .carry/ (never committed): triton22-cp312.tar.xz
# (a stripped Triton 2.2.0 for Python 3.12, unpacked to /tmp/t22) and wheels (*.whl, e.g.
# liger-kernel) installed to /tmp/site.
set -uo pipefail
OUT=${OUT:-/tmp/out}
TESTS=${TESTS:-packages}
BENCH=${BENCH:-$(ls -d packages/*/benchmarks)}
XDIST=${XDIST:-8}
XDIST_GPU=${XDIST_GPU:-2}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"

if ls .carry/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -f .carry/triton22-cp312.tar.xz ] && [ ! -d /tmp/t22/triton ]; then
  mkdir -p /tmp/t22 && tar -xJf .carry/triton22-cp312.tar.xz -C /tmp/t22
fi

# The suite in two pytest runs (small shapes in many processes, `gpu` tests in few); AOT
# compiling is the CPU machines' job. $1: log name; the rest: extra environment.
run_suite() {
  local log=$1; shift
  # shellcheck disable=SC2086
  env "$@" python3 -m pytest -q -n "$XDIST" -m "not aot and not gpu" --durations=8 $TESTS 2>&1 | tee "$OUT/$log-small.log" \
    | grep -E "passed|failed|FAILED|ERROR|Error|s call|s setup" | tail -40
  # shellcheck disable=SC2086
  env "$@" python3 -m pytest -q -n "$XDIST_GPU" -m "gpu" --durations=8 $TESTS 2>&1 | tee "$OUT/$log-gpu.log" \
    | grep -E "passed|failed|FAILED|ERROR|Error|s call|s setup" | tail -40
}

for step in "$@"; do
  case "$step" in
    tests3) run_suite tests-3x ;;
    tests22) run_suite tests-22 "PYTHONPATH=/tmp/t22${PYTHONPATH:+:$PYTHONPATH}" ;;
    bench)
      # shellcheck disable=SC2086
      python3 -m pytest -q -p no:xdist $BENCH --bench-table "$OUT/bench.md" 2>&1 | tee "$OUT/bench.log" \
        | grep -E "passed|failed|FAILED|ERROR|Error" | tail -20
      cat "$OUT/bench.md" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
