#!/usr/bin/env bash
# One prepared session on a lent GPU machine, run from the repository root:
#
#   bash benchmarks/gpu_session.sh            # results under $OUT (default: a new temporary folder)
#
# 1. installs the wheels carried in .whl/ (if any) into /tmp/site, first on PYTHONPATH;
# 2. machine facts (nvidia-smi, lscpu) into machine.txt;
# 3. gpu-check without the sweep: the default path's correctness checks, its timings
#    (GAE, vtrace, turn_gae against a D2D copy; host time per call), then the
#    experimental variants' checks, until GPU_SESSION_CHECK_END seconds (gpu_check.txt);
# 4. the tunable sweep until GPU_SESSION_SWEEP_END seconds, in a new process after a
#    hung setting (gpu-check's watchdog ends a process with exit status 3; the
#    progress file lets the next one skip what was started) (sweep.txt);
# 5. the CPU thread-scaling table of benchmarks/cpu_bench.py (cpu_threads.txt);
# 6. a summary: failures, hangs and the sweep's fastest settings.
#
# Every stage runs under `timeout`, so a stage that overruns costs only its own time.
# GPU_SESSION_STAGES picks stages (default "check sweep cpu"): a lease too short for
# all of them runs "check" in one call and "sweep cpu" in the next, while the machine
# is still warm.  The first call of each kernel compiles it (4-6 s on an H200 host):
# the default path's checks and timings alone take about 4 minutes.
set -u
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
T0=$(date +%s)
STAGES=" ${GPU_SESSION_STAGES:-check sweep cpu} "
CHECK_END=${GPU_SESSION_CHECK_END:-300}
SWEEP_END=${GPU_SESSION_SWEEP_END:-540}
CPU_SECONDS=${GPU_SESSION_CPU_SECONDS:-90}
at() { echo "== gpu_session: $1 at $(( $(date +%s) - T0 )) s"; }
quiet() { grep --line-buffered -v -e NumbaPerformanceWarning -e 'warn(errors.NumbaPerformanceWarning'; }

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 NUMBA_CACHE_DIR=/tmp/numba-cache
{
    date -u
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
    lscpu
    free -g
    python3 -c 'import sys, numpy, numba, cupy; print(sys.version); print("numpy", numpy.__version__, "numba", numba.__version__, "cupy", cupy.__version__)'
    python3 -m pip list 2>/dev/null | grep -i -E "^(numba|numba-cuda|cupy|torch|dask|cuda-bindings) "
} >"$OUT/machine.txt" 2>&1
at "setup done"

if [[ "$STAGES" == *" check "* ]]; then
    # The deadline, not the correctness budget, ends the checks.
    timeout -k 5 $(( CHECK_END + 30 )) python3 -m gaescan.bench.gpu_check --no-sweep --hang-seconds 45 \
        --check-budget 1e9 --deadline $(( T0 + CHECK_END )) 2>&1 | quiet | tee "$OUT/gpu_check.txt"
    at "gpu-check (exit status ${PIPESTATUS[0]})"
fi

[[ "$STAGES" == *" sweep "* ]] && for try in 1 2 3 4 5; do
    left=$(( T0 + SWEEP_END - $(date +%s) ))
    [ "$left" -gt 15 ] || break
    timeout -k 5 $(( left + 30 )) python3 -m gaescan.bench.gpu_check --sweep-only --hang-seconds 45 \
        --progress "$OUT/sweep-progress.txt" --deadline $(( T0 + SWEEP_END )) 2>&1 | quiet | tee -a "$OUT/sweep.txt"
    rc=${PIPESTATUS[0]}
    at "sweep process $try (exit status $rc)"
    [ "$rc" -eq 3 ] || break
done

if [[ "$STAGES" == *" cpu "* ]]; then
    timeout -k 5 "$CPU_SECONDS" python3 benchmarks/cpu_bench.py --repeat 3 --threads >"$OUT/cpu_threads.txt" 2>&1
    at "CPU thread scaling (exit status $?)"
fi

echo "== summary"
grep -h -s -e '^FAIL' -e '^HANG' -e 'FAILED' -e ' passed, ' "$OUT/gpu_check.txt" "$OUT/sweep.txt"
grep -h -s -e '^  [A-Za-z]' -e 'fastest' "$OUT/sweep.txt"
tail -n 25 "$OUT/cpu_threads.txt" 2>/dev/null
exit 0
