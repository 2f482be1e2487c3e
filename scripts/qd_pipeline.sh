#!/usr/bin/env bash
# Q&D end to end, CPU-sized (docs/QD.md, "Training"), on synthetic need-graph tasks (the default) or
# a shipped suite (BENCH=musique|strategyqa|2wiki):
#   warm start (imitate the scripted questioner's decisions: the action format)
#   -> job=qd_label (fork the warm model's runs, label candidates by their consequences)
#   -> job=sft (stage 1) -> job=dpo stage 2 -> job=dpo stage 3
#   -> job=qd_eval: each stage against the warm model (the same model before Q&D training) on
#      held-out tasks, rollout seeds, paired BCa over tasks.
# A step whose OUT_DIR/<step>/summary.json exists is not run again (rerun the script to resume;
# delete OUT_DIR/<step> to redo one).
# Usage: scripts/qd_pipeline.sh [OUT_DIR]
#   env: BENCH, SYN_TASKS, TOK, MODEL_FLAGS, DEMO_TASKS, TRAIN_TASKS, EVAL_FIRST, EVAL_TASKS, SEEDS, TEMP, FORKS,
#        CAPACITY, MAX_LEN, WARM_EPOCHS, WARM_BATCH, DPO_LR, MICRO
#   synthetic (defaults): scripts/qd_pipeline.sh runs/qd_synthetic
#   2wiki, tiny (docs/QD.md, 33 min on 2 cores): BENCH=2wiki TOK=tests/fixtures/tokenizer_qwen CAPACITY=8192 \
#     MAX_LEN=1280 MICRO=1 DEMO_TASKS=300 WARM_EPOCHS=10 WARM_BATCH=8 TRAIN_TASKS=8 FORKS=4 EVAL_FIRST=300 \
#     EVAL_TASKS=20 SEEDS=1 scripts/qd_pipeline.sh runs/qd_2wiki_b
set -euo pipefail
OUT=${1:-runs/qd_synthetic}
BENCH=${BENCH:-synthetic}
SYN_TASKS=${SYN_TASKS:-300}      # synthetic: tasks in the generated suite (task i is the same whatever the count)
TOK=${TOK:-jaxagent/data/tokenizers/qd_synthetic}
MODEL_FLAGS=${MODEL_FLAGS:-"model.preset=tiny-qwen2 model.hidden_size=128 model.intermediate_size=384 model.num_attention_heads=4 model.num_key_value_heads=2 model.head_dim=32 model.num_hidden_layers=4"}
DEMO_TASKS=${DEMO_TASKS:-200}    # the warm start imitates the scripted questioner on tasks 0..DEMO_TASKS-1
TRAIN_TASKS=${TRAIN_TASKS:-150}  # tasks 0..TRAIN_TASKS-1 are forked and labelled
EVAL_FIRST=${EVAL_FIRST:-200}    # held out: tasks EVAL_FIRST..EVAL_FIRST+EVAL_TASKS-1
EVAL_TASKS=${EVAL_TASKS:-100}
SEEDS=${SEEDS:-2}                # rollout seeds of the evaluation
TEMP=${TEMP:-0.7}                # the policy's sampling temperature (labelling and evaluation alike)
FORKS=${FORKS:-8}
CAPACITY=${CAPACITY:-1536}       # the engine's cache row: the longest decision prompt + max_new_tokens
MAX_LEN=${MAX_LEN:-5120}         # SFT rows / DPO pairs longer than this are left out (counted)
WARM_EPOCHS=${WARM_EPOCHS:-4}
WARM_BATCH=${WARM_BATCH:-16}
DPO_LR=${DPO_LR:-3e-5}           # 1e-4 made stage 2 emit broken JSON (docs/QD.md)
MICRO=${MICRO:-1}                # microbatches per SFT / DPO step (memory: long prompts want more)
POLICY="tokenizer=$TOK rollout.capacity=$CAPACITY rollout.slots=32 qd.concurrency=32 qd.max_new_tokens=128 qd.temperature=$TEMP"
mkdir -p "$OUT"
echo "[qd_pipeline] BENCH=$BENCH into $OUT/: 9 steps (demos, warm, label, stage1, stage2, stage3, eval_stage1..3)," \
  "each one launch whose progress follows; a finished step is skipped" >&2

step() {  # step NAME key=value ...: one launch into OUT/NAME, skipped when it finished before
  local name=$1
  shift
  if [ -s "$OUT/$name/summary.json" ]; then
    echo "[qd_pipeline] $name: done before ($OUT/$name/summary.json)" >&2
    return 0
  fi
  echo "[qd_pipeline] $name" >&2
  # a step cut short (no summary) starts over: overwrite=true replaces what it left
  python -m jaxagent.launch runs_dir="$OUT" name="$name" progress=true overwrite=true "$@"
}

if [ "$BENCH" = synthetic ]; then
  [ -s "$OUT/tasks.json" ] || echo "[qd_pipeline] tasks: $SYN_TASKS synthetic tasks into $OUT/tasks.json" >&2
  [ -s "$OUT/tasks.json" ] || python -m jaxagent.qd.synthetic "$OUT/tasks.json" --n "$SYN_TASKS" --depth 2 --breadth 1 --pool 8 --seed 1
  SUITE="qd.benchmark=synthetic qd.file=$OUT/tasks.json"
else
  SUITE="qd.benchmark=$BENCH"  # the shipped file
fi

# 0. the warm start's rows: every decision of the scripted questioner (no model)
step demos job=qd_label $SUITE qd.tasks="$DEMO_TASKS" qd.seeds=1 qd.forks=1 qd.questioner=scripted
step warm job=sft sft.data="$OUT/demos/decisions.jsonl" tokenizer="$TOK" $MODEL_FLAGS rollout.capacity="$CAPACITY" \
  sft.max_len="$MAX_LEN" \
  sft.microbatches="$MICRO" sft.batch_size="$WARM_BATCH" sft.epochs="$WARM_EPOCHS" sft.lr=2e-3 sft.warmup_ratio=0.05

# 1. fork the warm model's runs on the training tasks and label every candidate
step label job=qd_label $SUITE qd.tasks="$TRAIN_TASKS" qd.seeds=1 qd.forks="$FORKS" qd.questioner=policy \
  model.path="$OUT/warm/hf" $POLICY

# 2. stage 1 (imitation of the best question that clears the floor), stage 2 (question pairs),
#    stage 3 (question pairs + stop contrasts, stop_done pairs left out)
step stage1 job=sft sft.data="$OUT/label/sft.jsonl" model.path="$OUT/warm/hf" tokenizer="$TOK" sft.max_len="$MAX_LEN" \
  sft.microbatches="$MICRO" sft.batch_size=16 sft.epochs=2 sft.lr=1e-3 sft.warmup_ratio=0.03
step stage2 job=dpo dpo.data="$OUT/label/pairs.jsonl" dpo.stage=2 model.path="$OUT/stage1/hf" tokenizer="$TOK" \
  dpo.max_len="$MAX_LEN" dpo.microbatches="$MICRO" dpo.batch_size=16 dpo.lr="$DPO_LR" dpo.epochs=1
step stage3 job=dpo dpo.data="$OUT/label/pairs.jsonl" dpo.stage=3 model.path="$OUT/stage2/hf" tokenizer="$TOK" \
  dpo.max_len="$MAX_LEN" dpo.microbatches="$MICRO" dpo.batch_size=16 dpo.lr="$DPO_LR" dpo.epochs=1

# 3. held-out comparison at equal spend / own stop / the stop 2x2, each stage against the warm model
for stage in stage1 stage2 stage3; do
  step "eval_$stage" job=qd_eval $SUITE qd.first_task="$EVAL_FIRST" qd.tasks="$EVAL_TASKS" qd.seeds="$SEEDS" \
    qd.questioner=policy model.path="$OUT/$stage/hf" qd.baseline=policy qd.baseline_model="$OUT/warm/hf" $POLICY
done
echo "[qd_pipeline] done: results in $OUT/eval_stage1/, $OUT/eval_stage2/ and $OUT/eval_stage3/ (summary.json:" \
  "each stage against the warm model; docs/QD.md reads them)" >&2
