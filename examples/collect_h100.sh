#!/usr/bin/env bash
# The H100 ground truth of tests/data/h100 in one go (see its README):
#   bash examples/collect_h100.sh OUT_DIR [--small]
# Each script keeps going past a failing section and prints one summary line per trace.
set -u
out=${1:?usage: collect_h100.sh OUT_DIR [--small]}
shift
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
$py "$here/device_info.py" "$out/device_before.json"
$py "$here/collect_gpu_kernels.py" "$out" "$@"
$py "$here/collect_llama_step.py" "$out" "$@"
$py "$here/collect_moe_layer.py" "$out" "$@"
$py "$here/device_info.py" "$out/device_after.json"
du -sh "$out"/* 2>/dev/null
