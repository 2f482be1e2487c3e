"""Writes the tokenizer of the synthetic Q&D tasks to jaxagent/data/tokenizers/qd_synthetic/ (no network).

    python scripts/make_qd_tokenizer.py [--out jaxagent/data/tokenizers/qd_synthetic]

A byte-level BPE (Qwen2's pre-tokenizer, as ``make_tokenizer_fixture.py``) trained on the
questioner's decisions on synthetic need-graph tasks (`jaxagent.qd.synthetic`): the scripted
questioner (`jaxagent.qd.agents.ScriptedQuestioner`) with the offline extractive drafter and
answerer plays every task of a corpus of suites (depth 1-3, breadth 1-2, both joins, pools of 8,
generated with seed ``CORPUS_SEED``, which no documented evaluation uses), and every decision's
rendered prompt (`jaxagent.qd.loop.decision_prompts`) and canonical target
(`jaxagent.qd.labels.canonical_target`) are rendered as one user turn and one assistant turn
through the Qwen2.5-style template of ``make_tokenizer_fixture.py``, split at the special tokens.

Why a tokenizer of its own: with the 1,024-id test fixture a synthetic decision prompt takes
about 3.5 tokens per word (a made-up entity name 4-8 byte-level tokens), which makes a small
model's prompts long and the names it must copy into its question long. Trained on the suite's
own text, the template's words are single tokens and a name is two or three, so prompts are
about a third as long (the measured lengths are in the README this writes).

Vocabulary: ``VOCAB_TOTAL`` ids: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (ids 0-2), the
256 byte tokens, merges, then the six added tokens ``<tool_call>`` ... ``</think>`` last. Any text
round-trips. Deterministic: the same corpus and byte-identical files on every run
(``tests/test_qd_tokenizer.py`` regenerates them and compares).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python scripts/make_qd_tokenizer.py`
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from jaxagent.envs.retrieval_qa.tasks import musique_task  # noqa: E402
from jaxagent.qd import agents, labels  # noqa: E402
from jaxagent.qd.loop import decision_prompts, run_suite  # noqa: E402
from jaxagent.qd.prompts import parse_action  # noqa: E402
from jaxagent.qd.synthetic import generate  # noqa: E402
from jaxagent.text.template import render_template  # noqa: E402
from scripts.make_tokenizer_fixture import ADDED, QWEN25_TEMPLATE, SPECIAL, train_byte_level_bpe, write_fixture  # noqa: E402

DEFAULT_OUT = ROOT / "jaxagent" / "data" / "tokenizers" / "qd_synthetic"
VOCAB_TOTAL = 2048
CORPUS_SEED = 1000  # the corpus suites' seed; evaluations use other seeds
SHAPES = [(d, b, j) for d in (1, 2, 3) for b in (1, 2) for j in (("step", "question") if b > 1 else ("step",))]
TASKS_PER_SHAPE = 60
POOL = 8
REPORT_SEED, REPORT_TASKS = 1, 40  # the README's lengths: depth 2, breadth 1, pool 8, seed 1 (docs/QD.md's suite)
_SPLIT_SPECIAL = re.compile("|".join(re.escape(t) for t in SPECIAL + ADDED))


def _target(raw: str) -> str:
    a = parse_action(raw)
    c = labels.Candidate(index=0, seed=0, action="ask" if a.kind == "ask" else "stop", question=a.question,
                         rationale=a.rationale, raw=raw, malformed=a.malformed)
    return labels.canonical_target(c)


def decisions(depth: int, breadth: int, join: str, n: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, canonical target) of every scripted decision on a generated suite."""
    tasks = [musique_task(r, "synthetic") for r in generate(n, depth=depth, breadth=breadth, pool=POOL, seed=seed,
                                                               join=join)]
    runs = asyncio.run(run_suite(tasks, agents.ScriptedQuestioner(), agents.ExtractiveDrafter(),
                                 agents.ExtractiveAnswerer(), seeds=[0], key=jax.random.key(0)))
    by_id = {t.task_id: t for t in tasks}
    return [(p, _target(raw)) for run in runs for p, raw in decision_prompts(run, by_id[run.task_id])]


def render(prompt: str, completion: str) -> str:
    return render_template(QWEN25_TEMPLATE, [{"role": "user", "content": prompt},
                                             {"role": "assistant", "content": completion}],
                           add_generation_prompt=False)


def corpus() -> list[str]:
    texts = []
    for depth, breadth, join in SHAPES:
        for prompt, completion in decisions(depth, breadth, join, TASKS_PER_SHAPE, CORPUS_SEED):
            texts.extend(p for p in _SPLIT_SPECIAL.split(render(prompt, completion)) if p)
    return texts


def lengths(tokenizer_dir: Path) -> dict[str, float]:
    """Mean and max tokens of a rendered decision (prompt + target) and of its target alone on the
    report suite, for this tokenizer and for the 1,024-id test fixture."""
    from jaxagent.text.tokenizer import load_tokenizer

    rows = decisions(2, 1, "step", REPORT_TASKS, REPORT_SEED)
    out = {}
    for name, path in (("this", tokenizer_dir), ("fixture", ROOT / "tests" / "fixtures" / "tokenizer_qwen")):
        tok = load_tokenizer(path)
        full = [len(tok.encode(render(p, c))) for p, c in rows]
        target = [len(tok.encode(c)) for _, c in rows]
        out[name] = {"decision_mean": round(statistics.fmean(full), 1), "decision_max": max(full),
                     "target_mean": round(statistics.fmean(target), 1)}
    out["decisions"] = len(rows)
    return out


README = """# Tokenizer of the synthetic Q&D tasks

A {vocab}-id byte-level BPE for the synthetic need-graph tasks (`jaxagent.qd.synthetic`), with the
Qwen2.5-style chat template of the test fixtures. Load it with
`jaxagent.text.tokenizer.load_tokenizer("jaxagent/data/tokenizers/qd_synthetic")`, or pass
`tokenizer=jaxagent/data/tokenizers/qd_synthetic` to a job.

Made by

    python scripts/make_qd_tokenizer.py

(deterministic: running it again rewrites these files byte for byte; `tests/test_qd_tokenizer.py` checks).

- Corpus: every decision of the scripted questioner (offline extractive drafter and answerer) on
  {tasks} tasks per shape of the synthetic suites {shapes} (depth, breadth, join), pools of {pool},
  seed {seed}: each rendered prompt as a user turn and its canonical target as the assistant turn,
  cut at the special tokens ({n_texts} pieces).
- Vocabulary: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (ids 0-2), 256 byte tokens, merges,
  then the added tokens (the last {n_added} ids): {added}.
- EOS `<|im_end|>`; `generation_config.json` stops on `<|im_end|>` and `<|endoftext|>`; pad
  `<|endoftext|>`. Every text round-trips (byte-level, no normaliser).

Length in tokens of a rendered decision (prompt and target) on the {n_rows} scripted decisions of
the first {report_tasks} tasks of the depth-2 suite with seed {report_seed} (pools of {pool}):

| tokenizer | decision, mean | decision, max | target, mean |
|---|---|---|---|
| this one | {this[decision_mean]} | {this[decision_max]} | {this[target_mean]} |
| tests/fixtures/tokenizer_qwen (1,024 ids) | {fixture[decision_mean]} | {fixture[decision_max]} | {fixture[target_mean]} |
"""


def write(out: Path, vocab_total: int = VOCAB_TOTAL) -> dict:
    texts = corpus()
    tok = train_byte_level_bpe(texts, vocab_total)
    write_fixture(out, tok, QWEN25_TEMPLATE)
    cfg_path = out / "tokenizer_config.json"  # the template here too, for transformers that skip the .jinja
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN25_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    lens = lengths(out)
    (out / "README.md").write_text(README.format(
        vocab=tok.get_vocab_size(), tasks=TASKS_PER_SHAPE, shapes=", ".join(f"{d}x{b} {j}" for d, b, j in SHAPES),
        pool=POOL, seed=CORPUS_SEED, n_texts=len(texts), added=", ".join(f"`{t}`" for t in ADDED),
        n_added=len(ADDED), n_rows=lens["decisions"], report_tasks=REPORT_TASKS, report_seed=REPORT_SEED,
        this=lens["this"], fixture=lens["fixture"]))
    files = sorted(p.name for p in out.iterdir())
    return {"out": str(out), "files": files, "bytes": sum((out / f).stat().st_size for f in files),
            "vocab_size": tok.get_vocab_size(), "lengths": lens}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--vocab", type=int, default=VOCAB_TOTAL, help=argparse.SUPPRESS)  # for experiments
    args = ap.parse_args(argv)
    print(json.dumps(write(args.out, args.vocab)))


if __name__ == "__main__":
    main()
