#!/usr/bin/env bash
# The GPU check, for a lent GPU machine (the `device` tool): the kernel tests on CUDA (compiled
# Triton, not the interpreter), `agent-gravity bench kernels` in bf16 and fp32, then
# `agent-gravity bench prefill-speed` (adaptive prefill against dense attention up to 128K tokens, speed only).
# It needs python3 with torch, triton, transformers, pytest and matplotlib, which the device image has; it runs
# from the source tree without installing anything. Give it timeout_s=540.
#   device run: bash tests/gpu/run_on_device.sh     (results land in $OUT, else artifacts/device)
set -euo pipefail
cd "$(dirname "$0")/../.."
site=$(mktemp -d)
mkdir -p "$site/agent_gravity"
cp -r agent_gravity/. "$site/agent_gravity/"
cp -r kernels "$site/agent_gravity/kernels"
cp -r backends "$site/agent_gravity/backends"
export PYTHONPATH="$site" PYTHONUNBUFFERED=1
out="${OUT:-artifacts/device}"
mkdir -p "$out/fp32"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
python3 -m pytest --noconftest -q -p no:cacheprovider tests/kernels 2>&1 | tee "$out/tests.log"
python3 -m agent_gravity._cli bench kernels --device cuda --dtype bfloat16 --out "$out" | tee "$out/bench_bf16.txt"
python3 -m agent_gravity._cli bench kernels --device cuda --dtype float32 --out "$out/fp32" | tee "$out/bench_fp32.txt"
python3 -m agent_gravity._cli bench prefill-speed --device cuda --out "$out" | tee "$out/prefill_speed.txt"
