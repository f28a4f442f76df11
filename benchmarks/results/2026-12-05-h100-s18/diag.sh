#!/bin/bash
# usage: devtools/diag.sh LIMIT_S NAME ARGS... : benchmarks.generate with tunetree DEBUG logs, timestamped
limit=$1; name=$2; shift 2
export PYTHONUNBUFFERED=1; unset TORCH_LOGS
set -o pipefail
timeout -k 5 "$limit" python3 -u -c "
import logging, runpy, sys
logging.basicConfig(format='%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s', datefmt='%H:%M:%S')
logging.getLogger('tunetree').setLevel(logging.DEBUG)
sys.argv = ['benchmarks.generate'] + sys.argv[1:]
runpy.run_module('benchmarks.generate', run_name='__main__', alter_sys=True)
" "$@" 2>&1 | while IFS= read -r l; do echo "$(date +%T) $l"; done > "$OUT/$name.log"
echo "rc=$? for $name" | tee -a "$OUT/$name.log"
