#!/usr/bin/env bash
# One prepared script for a machine with a CUDA GPU (issue 35's acceptance): lowp's
# conformance check of the device kernels, then the linear benchmark on the GPU (portable and
# torch._scaled_mm through the device kernel table, against torch's BF16 F.linear, same run).
# Run from the repository root after `make build` (or `make test`); results go to $OUT
# (default out/gpu_check). Nothing here is needed by the tests: CI has no GPU.
#
#   OUT=/tmp/gpu benchmarks/device/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu_check}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
export PYTHONPATH=python
{
  echo "== machine"
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'capability', torch.cuda.get_device_capability())"
  ./build/bin/lowp info || true
} 2>&1 | tee "$OUT/machine.txt"
echo "== check_device cuda (standard, then edge)"
status=0
"$PY" -m lowp.torch.check_device --device cuda --suite standard --json "$OUT/check_standard.json" \
  2>&1 | tee "$OUT/check_standard.txt" || status=1
"$PY" -m lowp.torch.check_device --device cuda --suite edge --json "$OUT/check_edge.json" \
  2>&1 | tee "$OUT/check_edge.txt" || status=1
echo "== linear 4096 x 1024 -> 4096 bf16, forward + backward"
"$PY" -m lowp.bench portable --device cuda --device-kernels --reps 20 \
  --configs mxfp8,block32x32,block128,fp8_rowwise 2>&1 | tee "$OUT/linear.md"
echo "results in $OUT; check_device status $status"
exit $status
