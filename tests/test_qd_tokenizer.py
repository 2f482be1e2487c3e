"""The synthetic Q&D tasks' tokenizer (jaxagent/data/tokenizers/qd_synthetic, scripts/make_qd_tokenizer.py):
round trips, a decision row's tokens through the chat template, lengths against the test fixture,
and reproducible files."""

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxagent.envs.retrieval_qa.tasks import musique_task
from jaxagent.qd.agents import completion_ids, decision_prompt_ids
from jaxagent.qd.prompts import parse_action, render_state
from jaxagent.qd.synthetic import generate
from jaxagent.text.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
QD_TOKENIZER = ROOT / "jaxagent" / "data" / "tokenizers" / "qd_synthetic"
TOK = load_tokenizer(QD_TOKENIZER)
FIXTURE = load_tokenizer(ROOT / "tests" / "fixtures" / "tokenizer_qwen")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_round_trips(text):
    assert TOK.decode(TOK.encode(text)) == text


def test_vocabulary_and_stop_tokens():
    assert TOK.vocab_size == 2048
    gen = json.loads((QD_TOKENIZER / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [TOK.token_to_id("<|im_end|>"), TOK.token_to_id("<|endoftext|>")]
    assert [TOK.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]


def test_a_decision_is_a_user_turn_and_an_assistant_reply_less_than_half_the_fixtures_length():
    task = musique_task(generate(1, depth=2, breadth=1, pool=8, seed=7)[0], "synthetic")
    prompt = render_state(question=task.question, benchmark="synthetic", evidence=[], draft="", history=[])
    reply = json.dumps({"action": "ASK", "question": task.question, "rationale": "the task itself"}, sort_keys=True)
    ids = decision_prompt_ids(TOK, prompt)
    text = TOK.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert prompt in text
    done = completion_ids(TOK, reply)
    assert done[-1] == TOK.token_to_id("<|im_end|>") and TOK.decode(done[:-1]) == reply
    assert parse_action(TOK.decode(done[:-1])).question == task.question
    # the point of the tokenizer: the suite's text compresses to well under half the fixture's tokens
    assert len(ids) + len(done) < 0.5 * (len(decision_prompt_ids(FIXTURE, prompt)) + len(completion_ids(FIXTURE, reply)))


def test_script_reproduces_the_committed_files(tmp_path):
    script = ROOT / "scripts" / "make_qd_tokenizer.py"  # as a user runs it (tests do not import scripts/)
    out = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "qd")], capture_output=True, text=True,
                         timeout=600, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    committed = sorted(p.name for p in QD_TOKENIZER.iterdir())
    assert info["files"] == committed
    for f in committed:
        assert (tmp_path / "qd" / f).read_bytes() == (QD_TOKENIZER / f).read_bytes(), f
    assert info["lengths"]["this"]["decision_mean"] < 0.5 * info["lengths"]["fixture"]["decision_mean"]
