#!/usr/bin/env bash
# Run the five libFuzzer targets of tests/fuzz for FUZZ_SECONDS each (default 40), seeded with
# files the project writes (made here with the `lowp` tool of LOWP_CLI) and the committed
# regression inputs of tests/fuzz/corpus/TARGET/. Fails on the first finding; the crashing
# input is left in FUZZ_ARTIFACTS (default build-fuzz/artifacts): add it to
# tests/fuzz/corpus/TARGET/ once fixed.
#   usage: tests/fuzz/run.sh FUZZ_BUILD_DIR LOWP_CLI PYTHON
set -euo pipefail
cd "$(dirname "$0")/../.."
FB=${1:-build-fuzz}
CLI=${2:-build/bin/lowp}
PY=${3:-.venv/bin/python}
SECS=${FUZZ_SECONDS:-40}
ART=${FUZZ_ARTIFACTS:-$FB/artifacts}
WORK=$(mktemp -d /tmp/lowp_fuzz_XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$ART"

# ---- seeds, written by the project ----
for t in npy safetensors extra_state checkpoint quant_json; do mkdir -p "$WORK/seed_$t" "$WORK/corpus_$t"; done
"$PY" -c "import numpy as np; np.save('$WORK/x.npy', (np.arange(96, dtype=np.float32) - 40).reshape(8, 12) / 7)"
"$CLI" cast --to e4m3 "$WORK/x.npy" "$WORK/seed_npy/e4m3.npy" >/dev/null
"$CLI" cast --to bf16 "$WORK/x.npy" "$WORK/seed_npy/bf16.npy" >/dev/null
"$CLI" cast --from e4m3 "$WORK/seed_npy/e4m3.npy" "$WORK/seed_npy/f32.npy" >/dev/null
"$CLI" quantize --format e4m3 --scaling mx32 --axis both "$WORK/x.npy" "$WORK/q" >/dev/null
"$CLI" quantize --format e4m3 --scaling row "$WORK/x.npy" "$WORK/r" >/dev/null
cp "$WORK/q.data.npy" "$WORK/q.scale.npy" "$WORK/r.scale.npy" "$WORK/seed_npy/"
cp "$WORK/q.json" "$WORK/seed_quant_json/mx32.json"
cp "$WORK/r.json" "$WORK/seed_quant_json/row.json"
# The configuration fuzz_checkpoint.c builds its trainer with.
OMP_NUM_THREADS=1 "$CLI" train --config tiny --dim 16 --layers 1 --heads 2 --experts 2 --top-k 1 \
  --expert-hidden 16 --shared-hidden 16 --batch 2 --recipe fp8_delayed --steps 2 --eval-batches 1 \
  --sample 0 --threads 1 --checkpoint "$WORK/ck.safetensors" 2>/dev/null >/dev/null
# fuzz_checkpoint: a selector byte (odd: checksums recomputed after the mutation), then the file.
for sel in 00 01; do
  { printf "\x$sel"; cat "$WORK/ck.safetensors"; } > "$WORK/seed_checkpoint/ck_$sel.bin"
done
cp "$WORK/ck.safetensors" "$WORK/seed_safetensors/"
# Extra state: a selector byte (history length 4, CRC fixed up or not), then the blob.
for sel in 03 0b; do
  { printf "\x$sel"; cat tests/fixtures/extra_state_v1.bin; } > "$WORK/seed_extra_state/fixture_$sel.bin"
done

# ---- run ----
status=0
for t in npy safetensors extra_state checkpoint quant_json; do
  dirs=("$WORK/corpus_$t" "$WORK/seed_$t")
  [ -d "tests/fuzz/corpus/$t" ] && dirs+=("tests/fuzz/corpus/$t")
  maxlen=65536
  case $t in safetensors|checkpoint) maxlen=262144 ;; esac  # the seed checkpoint is ~190 KB
  start=$(date +%s)
  if TMPDIR="$WORK" ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$FB/bin/fuzz_$t" -max_total_time="$SECS" -timeout=20 -rss_limit_mb=2560 -max_len=$maxlen \
       -artifact_prefix="$ART/${t}-" -print_final_stats=1 "${dirs[@]}" > "$WORK/log_$t" 2>&1; then
    echo "fuzz_$t: $(grep -E '^stat::number_of_executed_units' "$WORK/log_$t" | awk '{print $2}') runs, no finding ($(( $(date +%s) - start )) s)"
  else
    echo "fuzz_$t: FINDING (input in $ART):"; tail -40 "$WORK/log_$t"; status=1
  fi
done
exit $status
