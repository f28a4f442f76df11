#!/bin/bash
# Session 24 GPU checks: the workspace test before and after the fix, then the GPU tests.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv > $OUT/card.txt
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" | tee $OUT/versions.txt
cp tunetree/generation/multistep.py /tmp/fixed.py
# old_multistep.py: `git show 72199bc:tunetree/generation/multistep.py` (the code before the fix)
cp old_multistep.py tunetree/generation/multistep.py
echo "== before the fix" | tee $OUT/before.log
timeout 240 python3 -m pytest -p no:cacheprovider -m gpu -x -q tests/generation/test_multistep.py -k outlives -o addopts="" 2>&1 | tail -30 | tee -a $OUT/before.log
cp /tmp/fixed.py tunetree/generation/multistep.py
echo "== after the fix" | tee $OUT/after.log
timeout 240 python3 -m pytest -p no:cacheprovider -m gpu -q tests/generation/test_multistep.py tests/backends/test_device_graph.py -o addopts="" 2>&1 | tail -30 | tee -a $OUT/after.log
