#!/bin/bash
# Session 24: tt.jit's warm start on the GPU host's 16-core CPU (the GPU unused).
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=""
lscpu | grep -E "Model name|^CPU\(s\)|Thread" > $OUT/lscpu.txt
lscpu | grep Flags | grep -o -E "amx[a-z0-9_]*|avx512[a-z0-9_]*" | sort -u | tr '\n' ' ' >> $OUT/lscpu.txt
python3 -c "import torch, transformers, onnxruntime, onnx; print(torch.__version__, transformers.__version__, onnxruntime.__version__, onnx.__version__)" > $OUT/versions.txt
(date -u; uptime; timeout 530 python3 benchmarks/jit.py --model base --calls ${CALLS:-16} --duty 0.5 --no-compare \
  --backends onnxruntime --max-depth 1 --time-budget 150 --cache /tmp/jitcache \
  --warm-log $OUT/warm.log --json $OUT/base-ort-16core${TAG:-}.json 2>&1 | grep -v -e '^W12' -e torchao; uptime; date -u) | tee $OUT/base-ort-16core${TAG:-}.txt
