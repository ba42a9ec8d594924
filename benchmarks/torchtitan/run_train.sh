#!/bin/sh
# lowp's torchtitan benchmark (issue 39.4): torchtitan's DeepSeek-V3 debug model and a larger
# MoE, bf16 against lowp's recipes and torchtitan's own MXFP8 converters on lowp's kernels, in
# one process and in two (FSDP2 over gloo), at the same seed, every figure from one run of
# this script. Writes out/torchtitan/*.json and out/torchtitan/table.md.
#   sh benchmarks/torchtitan/run_train.sh            (STEPS, SMALL_STEPS, SEQ, BATCH to change)
set -eu
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=out/torchtitan
STEPS=${STEPS:-20}
SMALL_STEPS=${SMALL_STEPS:-8}
SEQ=${SEQ:-256}
BATCH=${BATCH:-2}
RECIPES=${RECIPES:-bf16,all_mxfp8,mix,all_block_fp8,torchtitan_mxfp8}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH=python:. LOWP_TITAN_ASSETS=$OUT/assets
mkdir -p $OUT
[ -f $OUT/assets/tokenizer/tokenizer.json ] || $PY benchmarks/torchtitan/assets.py $OUT/assets

# One launch per config (a second torchtitan Trainer in a process of two ranks finds its
# parameters on the first one's device mesh); all launches of one run_train.sh are one run.
for model in debug moe_small; do
  steps=$STEPS; [ $model = debug ] || steps=$SMALL_STEPS
  for n in 1 2; do
    for r in $(echo "$RECIPES" | tr ',' ' '); do
      $PY -m torch.distributed.run --nproc_per_node=$n --master_port=$((29600 + n)) \
        benchmarks/torchtitan/run.py --configs ${model}_$r --out $OUT/${model}_${n}_$r.json -- \
        --training.steps $steps --training.seq_len $SEQ --training.local_batch_size $BATCH \
        --dump_folder $OUT/runs > $OUT/${model}_${n}_$r.log 2>&1
    done
  done
done
{
  $PY benchmarks/torchtitan/table.py $OUT/debug_[12]_*.json --at 1,10,$STEPS
  echo
  $PY benchmarks/torchtitan/table.py $OUT/moe_small_[12]_*.json --at 1,5,$SMALL_STEPS
} > $OUT/table.md
cat $OUT/table.md
