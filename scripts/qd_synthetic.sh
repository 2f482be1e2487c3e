#!/usr/bin/env bash
# Q&D end to end on synthetic need-graph tasks, CPU-sized (docs/QD.md, "Training"):
#   warm start (imitate the scripted questioner's decisions: the action format)
#   -> job=qd_label (fork the warm model's runs, label candidates by their consequences)
#   -> job=sft (stage 1) -> job=dpo stage 2 -> job=dpo stage 3
#   -> job=qd_eval: the trained questioner against the warm model (the same model before Q&D
#      training) on held-out tasks, 2 rollout seeds, paired BCa over tasks.
# Usage: scripts/qd_synthetic.sh [OUT_DIR]   (env: MODEL_FLAGS, TRAIN_TASKS, EVAL_TASKS, TEMP, FORKS)
set -euo pipefail
OUT=${1:-runs/qd_synthetic}
TOK=${TOK:-tests/fixtures/tokenizer_qwen}
MODEL_FLAGS=${MODEL_FLAGS:-"model.preset=tiny-qwen2 model.hidden_size=128 model.intermediate_size=384 model.num_attention_heads=4 model.num_key_value_heads=2 model.head_dim=32 model.num_hidden_layers=4"}
TRAIN_TASKS=${TRAIN_TASKS:-64}   # tasks 0..TRAIN_TASKS-1 are forked and labelled
EVAL_TASKS=${EVAL_TASKS:-60}     # held out: tasks 200..200+EVAL_TASKS-1
TEMP=${TEMP:-0.7}                # the policy's sampling temperature (labelling and evaluation alike)
FORKS=${FORKS:-8}
POLICY="tokenizer=$TOK rollout.capacity=1664 qd.max_new_tokens=128 qd.temperature=$TEMP"
L="python -m jaxagent.launch runs_dir=$OUT"
mkdir -p "$OUT"

python -m jaxagent.qd.synthetic "$OUT/tasks.json" --n 300 --depth 2 --breadth 1 --pool 8 --seed 1
SUITE="qd.benchmark=synthetic qd.file=$OUT/tasks.json"

# 0. the warm start's rows: every decision of the scripted questioner on 200 tasks (no model)
$L name=demos job=qd_label $SUITE qd.tasks=200 qd.seeds=1 qd.forks=1 qd.questioner=scripted
$L name=warm job=sft sft.data="$OUT/demos/decisions.jsonl" tokenizer="$TOK" $MODEL_FLAGS \
  sft.batch_size=16 sft.epochs=4 sft.lr=2e-3 sft.warmup_ratio=0.05

# 1. fork the warm model's runs on the training tasks and label every candidate
$L name=label job=qd_label $SUITE qd.tasks="$TRAIN_TASKS" qd.seeds=1 qd.forks="$FORKS" qd.questioner=policy \
  model.path="$OUT/warm/hf" $POLICY

# 2. stage 1 (imitation of the best question that clears the floor), stage 2 (question pairs),
#    stage 3 (question pairs + stop contrasts, stop_done pairs left out)
$L name=stage1 job=sft sft.data="$OUT/label/sft.jsonl" model.path="$OUT/warm/hf" tokenizer="$TOK" \
  sft.batch_size=16 sft.epochs=2 sft.lr=1e-3 sft.warmup_ratio=0.03
$L name=stage2 job=dpo dpo.data="$OUT/label/pairs.jsonl" dpo.stage=2 model.path="$OUT/stage1/hf" tokenizer="$TOK" \
  dpo.batch_size=16 dpo.lr=1e-4 dpo.epochs=1
$L name=stage3 job=dpo dpo.data="$OUT/label/pairs.jsonl" dpo.stage=3 model.path="$OUT/stage2/hf" tokenizer="$TOK" \
  dpo.batch_size=16 dpo.lr=1e-4 dpo.epochs=1

# 3. held-out comparison at equal spend / own stop / the stop 2x2, each stage against the warm model
for stage in stage1 stage2 stage3; do
  $L name="eval_$stage" job=qd_eval $SUITE qd.first_task=200 qd.tasks="$EVAL_TASKS" qd.seeds=2 \
    qd.questioner=policy model.path="$OUT/$stage/hf" qd.baseline=policy qd.baseline_model="$OUT/warm/hf" $POLICY
done
