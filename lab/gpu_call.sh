#!/usr/bin/env bash
# One device call of several timed steps whose logs travel back as one archive (the device
# returns at most 8 files): lab/gpu_call.sh NAME 'TIMEOUT CMD...' ['TIMEOUT CMD...' ...]
# Each step runs under `timeout TIMEOUT` with its output in W/NN.txt (W=/tmp/gpu_call; the
# commands may write more files under $W); $OUT/NAME.tgz holds W at the end, and a summary
# line per step (rc, seconds) goes to $OUT/NAME-steps.txt and stdout.
# The device's copy of .git can be stale (its HEAD was the session's first commit for a whole
# session): run as `KERNELLAB_GIT_SHA=$(git rev-parse --short=12 HEAD) bash lab/gpu_call.sh ...`
# with the SHA written into the command here, so the rows carry the commit they measured.
# Write outputs under $W, not $OUT/<dir>: the device returns at most 8 files from $OUT.
# A fresh machine has no C++ nodes: the first eager call that wants them starts their build
# in the background (~40 s) and harness.bench / user_models wait for it before timing; give
# a step KERNELLAB_CPP_NODES=off where they do not matter (an attention or matmul tune).
set -u
NAME=$1
shift
export W=/tmp/gpu_call
rm -rf "$W" && mkdir -p "$W"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=160
export KERNELLAB_CACHE=${KERNELLAB_CACHE:-/tmp/kernellab-cache}
i=0
for s in "$@"; do
  i=$((i + 1))
  t=${s%% *}
  cmd=${s#* }
  f=$(printf '%s/%02d.txt' "$W" "$i")
  echo "+ $cmd" >"$f"
  t0=$(date +%s)
  timeout "$t" bash -c "$cmd" >>"$f" 2>&1
  rc=$?
  line="step $i rc=$rc $(($(date +%s) - t0))s: $cmd"
  echo "$line" | tee -a "${OUT:-$W}/$NAME-steps.txt"
  tail -n 4 "$f"
  # after every step: a call cut short by the device's limit still brings back the steps done
  tar czf "${OUT:-/tmp}/$NAME.tgz" -C "$W" .
done
