#!/usr/bin/env bash
# GPU check: run on a machine with an NVIDIA GPU and CuPy (cupy-cuda13x); installs nothing.
#   1. the GPU-marked tests (generated kernels checked on the device, dynamic shared memory,
#      baseline, calibration);
#   2. scripts/gpu_bench.py: every workload's best kernels vs the unfused baseline (and PyTorch
#      when importable), a table on stdout and JSON in $OUT (default gpu_check.json).
# Extra arguments go to gpu_bench.py (e.g. --all-shapes, --report FILE, --target h100).
# Environment: PYTHON (default python3), OUT. Budget: well under 8 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-gpu_check.json}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, installed or not

if ! "$PYTHON" -c 'import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0' 2>/dev/null; then
  echo "gpu_check: no usable GPU through CuPy with $PYTHON; nothing to check" >&2
  exit 2
fi

echo "== GPU-marked tests"
mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
timeout 300 "$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider "${gpu_files[@]}"
tests_rc=$?

echo
echo "== timing (medians of CUDA-event timings; kernels checked against float64 first)"
timeout 240 "$PYTHON" scripts/gpu_bench.py --json "$OUT" "$@"
bench_rc=$?

echo
echo "gpu_check: tests exit ${tests_rc}, benchmark exit ${bench_rc}"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
