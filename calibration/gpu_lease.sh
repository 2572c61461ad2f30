#!/usr/bin/env bash
# One short GPU lease, end to end: the kernel microbenchmarks, their held-out validation against
# the shipped profile and a fit, the end-to-end check of a full-size Llama-3-8B, and the launch
# and CUDA-graph costs of its decode steps (servesim calibrate launch, about 35 s).
#
#   bash calibration/gpu_lease.sh OUT_DIR [REPS] [norefit]
#
# Each stage runs under its own time limit, so a slow stage costs only itself and whatever
# finished is packed into OUT_DIR/gpu_run.tgz (plus log.txt) at the end. REPS (default 15) timed
# repetitions per kernel after REPS/5 warm-ups: the full grid is about 5,700 kernels, which at the
# default 50 repetitions would not fit a 15-minute lease. A third argument `norefit` skips the
# refit of the profile to these timings (80 s; a record only, never shipped), so the rest fits one
# 10-minute command. Needs servesim and torch installed.
set -u
out=${1:?usage: gpu_lease.sh OUT_DIR [REPS]}
reps=${2:-15}
refit=${3:-refit}
work=$(mktemp -d)
mkdir -p "$out"
log="$out/log.txt"
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
stage() {  # stage SECONDS CMD...: run with a limit, log everything, never stop the script
    local limit=$1; shift
    say "$*"
    timeout "$limit" "$@" >>"$log" 2>&1
    say "exit $?"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
    >>"$log" 2>&1
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H200*) profile=h200-sxm-141gb ;;
    *H100*) profile=h100-sxm-80gb ;;
    *B200*) profile=b200 ;;
    *A100*) profile=a100-sxm-80gb ;;
    *) profile=h100-sxm-80gb ;;
esac
say "profile $profile"

stage 200 python3 -m servesim calibrate e2e --device cuda --profile "$profile" \
    --out "$work/e2e_steps.csv"
stage 100 python3 -m servesim calibrate launch --device cuda --profile "$profile" \
    --out "$work/launch.csv"
stage 270 python3 -m servesim calibrate bench --device cuda --reps "$reps" --out "$work/bench"
stage 40 python3 -m servesim calibrate validate "$work/bench" --profile "$profile" \
    --out "$work/validation"
if [ "$refit" != norefit ]; then
    stage 40 python3 -m servesim calibrate fit "$work/bench" --profile "hardware_profiles/$profile.yaml" \
        --out "$work/fitted-$profile.yaml"
    stage 40 python3 -m servesim calibrate validate "$work/bench" --profile "$work/fitted-$profile.yaml"
fi

rm -f "$work/validation/validation.html"  # plotly's page is megabytes; the CSVs hold its data
tar czf "$out/gpu_run.tgz" -C "$work" .
say "packed $(tar tzf "$out/gpu_run.tgz" | wc -l) entries"
