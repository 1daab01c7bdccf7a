#!/usr/bin/env bash
# The whole lent-GPU session in one command: ../shared/GPU.md's recipe, then benchmarks/gpu_acceptance.py.
#
# Run from the repository root on the lent machine, with Ultralytics' wheels carried in .gpu/whl (GPU.md says how
# to download them here: the machine reaches no package registry). Through the device tool:
#
#     run(command="bash benchmarks/gpu_run.sh", carry=[".gpu"], timeout_s=600)
#
# It installs the carried wheels into /tmp/site and the project into /tmp/site2 (from its wheel in .gpu/project/
# where one was carried: the machine's setuptools may be older than the pyproject needs; build it here with
# `pip wheel --no-deps --no-build-isolation -w .gpu/project .`), puts both first on PYTHONPATH, and runs the
# acceptance script with a time limit, so that a report always comes back: $OUT/gpu-acceptance/ (gpu-acceptance.md,
# corpus.jsonl, logs.tar.gz: the device tool brings back 8 files at most, so the logs come as one archive), and
# this script's own output in $OUT/gpu-run.log.
# Arguments go to gpu_acceptance.py (e.g. --steps 2,5 to run two steps again; --device 0,1 on two GPUs).
# GPU_RUN_LIMIT (seconds, default 540) bounds the script: its own budget is 480 s, the rest is its cleanup.
set -uo pipefail

OUT="${OUT:-/tmp/gpu-run}"
LIMIT="${GPU_RUN_LIMIT:-540}"
mkdir -p "$OUT"
LOG="$OUT/gpu-run.log"
say() { echo "gpu_run: $*" | tee -a "$LOG"; }

cd "$(dirname "$0")/.." || exit 2
shopt -s nullglob
wheels=(.gpu/whl/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    say "no wheels in .gpu/whl: download them as ../shared/GPU.md says, and carry .gpu"
    exit 2
fi

say "$(date -u +%FT%TZ) installing ${#wheels[@]} carried wheels into /tmp/site, the project into /tmp/site2"
if ! python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}" \
    >>"$LOG" 2>&1; then
    say "installing the carried wheels failed: see $LOG"
    exit 3
fi
project=(.gpu/project/*.whl)
# a wheel built from another tree than this one would measure other code: then the tree, if this setuptools can
if [ ${#project[@]} -gt 0 ] && ! python3 - "${project[0]}" >>"$LOG" 2>&1 <<'EOF'
import sys, zipfile
from pathlib import Path
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in wheel.namelist():
        if name.startswith("rocm_yolo/") and name.endswith(".py"):
            inner = name[len("rocm_yolo/"):]
            tree = Path("patches", inner[len("patches/"):]) if inner.startswith("patches/") else Path("rocm_yolo", inner)
            if not tree.is_file() or tree.read_bytes() != wheel.read(name):
                sys.exit(f"{sys.argv[1]} holds another {tree} than this tree")
EOF
then
    say "the carried wheel is not this tree's (see $LOG): installing the tree itself; rebuild .gpu/project next time"
    project=()
fi
[ ${#project[@]} -eq 0 ] && project=(--no-build-isolation .)
if ! python3 -m pip install -q --upgrade --no-index --no-deps --target /tmp/site2 "${project[@]}" >>"$LOG" 2>&1; then
    say "installing the project failed: see $LOG"
    exit 3
fi
export PYTHONPATH=/tmp/site2:/tmp/site PATH=/tmp/site2/bin:$PATH YOLO_OFFLINE=1 MPLBACKEND=Agg PYTHONUNBUFFERED=1

nvidia-smi >>"$LOG" 2>&1 || true
say "$(date -u +%FT%TZ) python3 benchmarks/gpu_acceptance.py $OUT/gpu-acceptance --device 0 $* (limit ${LIMIT} s)"
timeout -k 20 "$LIMIT" python3 benchmarks/gpu_acceptance.py "$OUT/gpu-acceptance" --device 0 "$@" 2>&1 | tee -a "$LOG"
code=${PIPESTATUS[0]}
if [ -d "$OUT/gpu-acceptance/logs" ]; then
    tar -czf "$OUT/gpu-acceptance/logs.tar.gz" -C "$OUT/gpu-acceptance" logs && rm -rf "$OUT/gpu-acceptance/logs"
fi
say "$(date -u +%FT%TZ) gpu_acceptance.py exited with $code; the report: $OUT/gpu-acceptance/gpu-acceptance.md"
exit "$code"
