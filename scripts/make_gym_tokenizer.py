"""Writes the quickstart tokenizer of the scripted gyms to jaxagent/data/tokenizers/gyms/ (no network).

    python scripts/make_gym_tokenizer.py [--out jaxagent/data/tokenizers/gyms]

A byte-level BPE (Qwen2's pre-tokenizer, as ``make_tokenizer_fixture.py``) trained on the chats of
expert and random-policy episodes of the four scripted gyms (``jaxagent.envs.gyms``; train split
only): each episode's transcript rendered through the Qwen2.5-style chat template of
``make_tokenizer_fixture.py`` with the gyms' tool schema in the system turn, split at the special
and added tokens (which are never merged across). Saved as a Hugging Face tokenizer directory with
that template (in ``tokenizer_config.json`` and ``chat_template.jinja``), ``<|im_end|>`` as EOS and
``generation_config.json`` listing ``<|im_end|>`` and ``<|endoftext|>`` as stop tokens, plus a
README.md with the command and the measured episode lengths.

Vocabulary: ``VOCAB_TOTAL`` = 944 ids: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (ids
0-2), the 256 byte tokens, 679 merges, then the six added tokens ``<tool_call>``, ``</tool_call>``,
``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>`` (ids 938-943), as in the test
fixtures. Any text round-trips (byte-level, no normaliser); the gyms' closed vocabulary and the
template text are what the merges compress. 944 is close to the most merges this corpus allows
(about 947); at 512 most gym words took several tokens, at 944 nearly every word a task's values
use is one token, which is what lets a tiny model copy them (and shortens episodes by a quarter).

Deterministic: the same episodes (fixed task seeds and policy seeds) and byte-identical files on
every run (``tests/test_demos.py`` regenerates them and compares).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python scripts/make_gym_tokenizer.py`
    sys.path.insert(0, str(ROOT))

from jaxagent.envs.gyms import GYMS, TOOL_SCHEMA
from jaxagent.envs.base import transcript_to_chat
from jaxagent.envs.gyms.demos import expert_plan
from jaxagent.rollout.demos import play_demos, render_demo
from jaxagent.rollout.runner import play_policy
from jaxagent.text.template import render_template
from scripts.make_tokenizer_fixture import ADDED, QWEN25_TEMPLATE, SPECIAL, train_byte_level_bpe, write_fixture

DEFAULT_OUT = ROOT / "jaxagent" / "data" / "tokenizers" / "gyms"
VOCAB_TOTAL = 944
N_TASKS = 200           # train tasks per gym
RANDOM_PER_TASK = 2     # random-policy episodes per task (plus one expert episode)
CORPUS_SEED = 0
N_REPORT = 20           # test tasks per gym for the README's length report
_SPLIT_SPECIAL = re.compile("|".join(re.escape(t) for t in SPECIAL + ADDED))


async def _episodes() -> list[list[dict]]:
    """Chats of the corpus episodes: per gym, per train task, the expert's and random policies'."""
    out = []
    for name in sorted(GYMS):
        spec = GYMS[name]
        for i, task in enumerate(spec.make_tasks("train", N_TASKS, CORPUS_SEED)):
            _, transcript = await play_policy(spec.env(), spec.expert_policy, task, seed=i)
            out.append(transcript_to_chat(transcript))
            for k in range(RANDOM_PER_TASK):
                policy = spec.random_policy(random.Random(f"{task}|random|{k}"))
                _, transcript = await play_policy(spec.env(), policy, task, seed=RANDOM_PER_TASK * i + k)
                out.append(transcript_to_chat(transcript))
    return out


def corpus() -> list[str]:
    """The training texts: every corpus episode rendered through the chat template with the tool
    schema, cut at the special and added tokens (the pieces between them, non-empty)."""
    texts = []
    for messages in asyncio.run(_episodes()):
        text = render_template(QWEN25_TEMPLATE, messages, tools=[TOOL_SCHEMA], add_generation_prompt=False)
        texts.extend(p for p in _SPLIT_SPECIAL.split(text) if p)
    return texts


def train_tokenizer(vocab_total: int = VOCAB_TOTAL):
    """The gyms' BPE (``train_byte_level_bpe`` on the gym chats) with ``vocab_total`` ids."""
    return train_byte_level_bpe(corpus(), vocab_total)


def expert_lengths(tokenizer_dir: Path) -> dict[str, float]:
    """Mean tokens of a rendered expert demo (``render_demo``) on ``N_REPORT`` test tasks per gym."""
    from jaxagent.text.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    return {name: statistics.fmean(len(render_demo(d, tok)[0]) for d in play_demos(expert_plan(name, "test", N_REPORT)))
            for name in sorted(GYMS)}


README = """# Quickstart tokenizer of the scripted gyms

A {vocab}-id byte-level BPE for the scripted user gyms (`jaxagent.envs.gyms`), with a Qwen2.5-style
chat template (tools in the system turn, `<tool_call>` JSON in assistant turns, tool results as
`<tool_response>` blocks in user turns). Load it with
`jaxagent.text.tokenizer.load_tokenizer("jaxagent/data/tokenizers/gyms")`.

Made by

    python scripts/make_gym_tokenizer.py

(deterministic: running it again rewrites these files byte for byte; `tests/test_demos.py` checks).

- Corpus: the chats of {episodes} episodes on train tasks only ({tasks} tasks per gym, seed {seed};
  per task one expert episode and {random} random-policy episodes), rendered through the template
  with the `interact_with_env` tool schema, cut at the special tokens.
- Vocabulary: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` (ids 0-2), 256 byte tokens, merges,
  then the added tokens (the last {n_added} ids):
  {added}.
- EOS `<|im_end|>`; `generation_config.json` stops on `<|im_end|>` and `<|endoftext|>`; pad
  `<|endoftext|>`.
- Every text round-trips (byte-level, no normaliser).

Mean length in tokens of an expert demo (`jaxagent.rollout.demos.render_demo`, system turn with
the tool schema included, up to the last assistant turn) on {n_report} test tasks per gym:

{lengths}
"""


def write(out: Path, vocab_total: int = VOCAB_TOTAL) -> dict:
    tok = train_tokenizer(vocab_total)
    write_fixture(out, tok, QWEN25_TEMPLATE)
    # The template in tokenizer_config.json too, for transformers versions that do not read
    # chat_template.jinja.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN25_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    lengths = expert_lengths(out)
    (out / "README.md").write_text(README.format(
        vocab=tok.get_vocab_size(), episodes=len(GYMS) * N_TASKS * (1 + RANDOM_PER_TASK), tasks=N_TASKS,
        seed=CORPUS_SEED, random=RANDOM_PER_TASK, added=", ".join(f"`{t}`" for t in ADDED), n_added=len(ADDED),
        n_report=N_REPORT, lengths="\n".join(f"- {k}: {v:.1f}" for k, v in lengths.items())))
    files = sorted(p.name for p in out.iterdir())
    return {"out": str(out), "files": files, "bytes": sum((out / f).stat().st_size for f in files),
            "vocab_size": tok.get_vocab_size(), "mean_expert_tokens": {k: round(v, 1) for k, v in lengths.items()}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--vocab", type=int, default=VOCAB_TOTAL, help=argparse.SUPPRESS)  # for experiments
    args = ap.parse_args(argv)
    print(json.dumps(write(args.out, args.vocab)))


if __name__ == "__main__":
    main()
