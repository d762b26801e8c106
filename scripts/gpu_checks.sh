#!/usr/bin/env bash
# The checks that need a CUDA GPU: the callbacks' tests with their CUDA variants (adapters,
# in-training audit, no host synchronisation per step, autocast), Opacus's training modes on
# CUDA (ghost clipping, virtual steps), the examples that train on the GPU, and the monitor's
# overhead benchmark on CUDA.
#
#   scripts/gpu_checks.sh [OUT_DIR]        # logs in OUT_DIR (default: gpu-checks/)
#
# Environment: REPEATS (the benchmark's, default 3), EXAMPLES_OUT (the examples' outputs,
# default OUT_DIR/examples).
#
# Uses $PYTHON (default python3), which must hold torch with CUDA and this project's
# dependencies (or find them on PYTHONPATH); the project itself is taken from this checkout.
# Exits non-zero when a check fails or when CUDA is not available.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${1:-gpu-checks}
REPEATS=${REPEATS:-3}
EXAMPLES_OUT=${EXAMPLES_OUT:-$OUT/examples}
mkdir -p "$OUT" "$EXAMPLES_OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

step() {  # step NAME COMMAND...: run, log to OUT/NAME.log, remember a failure
    local name=$1
    shift
    echo "== $name: $*"
    local t0=$SECONDS
    if "$@" >"$OUT/$name.log" 2>&1; then
        echo "== $name: ok in $((SECONDS - t0)) s"
    else
        echo "== $name: FAILED (exit $?) in $((SECONDS - t0)) s"
        status=1
    fi
    tail -n "${TAIL:-15}" "$OUT/$name.log"
}

"$PY" - <<'EOF' || exit 1
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("CUDA is not available: nothing to check here")
import opacus

print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}),"
      f" opacus {opacus.__version__}, {torch.cuda.get_device_name()}")
EOF

# Every callbacks test; the CUDA variants are the ones named [cuda] or *cuda* (listed with -rA).
step tests "$PY" -m pytest -p no:cacheprovider -q -n 8 -rA tests/callbacks
grep -E "PASSED|FAILED|ERROR|SKIPPED" "$OUT/tests.log" | grep -i cuda || {
    echo "== no CUDA test ran"
    status=1
}
# Opacus's training modes on the GPU (ghost clipping, virtual steps, accumulation): steps and
# divisors. DDP/FSDP need one GPU per rank with NCCL; on one GPU they are checked on CPU/gloo
# (tests/auditing/opacus_releases/test_distributed_modes.py, -m slow).
step training_modes "$PY" -m pytest -p no:cacheprovider -q -rA tests/auditing/opacus_releases/test_modes.py -k cuda
grep -E "PASSED" "$OUT/training_modes.log" | grep -q cuda || {
    echo "== no CUDA training-mode test ran"
    status=1
}
step train_digits "$PY" examples/train_digits.py --quick --device cuda --canaries 200
step in_training_audit "$PY" examples/in_training_audit.py --quick --device cuda
step lightning_digits "$PY" examples/lightning_digits.py --quick --out "$EXAMPLES_OUT/lightning_digits"
step huggingface_digits "$PY" examples/huggingface_digits.py --quick --out "$EXAMPLES_OUT/huggingface_digits"
TAIL=30 step overhead "$PY" benchmarks/bench_monitor_overhead.py --device cuda --repeats "$REPEATS"
exit $status
