"""The questioner-drafter loop: the action contract, the prompt, the episode's stops (the Q&D
spec's §6 check 10), the offline stand-ins, the scripted questioner on real tasks, a local policy."""

import asyncio
import dataclasses
import json
import re
import threading
from http.server import BaseHTTPRequestHandler

import jax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxagent.envs.retrieval_qa.tasks import QATask, Unit, load_suite, musique_task
from jaxagent.qd import metrics as M
from jaxagent.qd.agents import (
    ExtractiveAnswerer,
    ExtractiveDrafter,
    NeverAsk,
    PolicyQuestioner,
    Reply,
    ScriptedQuestioner,
    best_sentence,
)
from jaxagent.qd.graphs import musique_graph
from jaxagent.qd.loop import LoopConfig, decision_prompts, run_episode, run_suite
from jaxagent.qd.prompts import EvidenceView, ask_json, first_json_object, parse_action, render_state
from jaxagent.qd.synthetic import generate
from jaxagent.qd.transcript import QDRun, read_runs, write_runs
from tests.loopback import LoopbackServer

TASK = QATask("musique", "t1", "Who founded the company that makes Zorp?", "Ann Lee", ("Ann",),
              tuple(Unit(i, str(i), title, text) for i, (title, text) in enumerate([
                  ("Zorp", "Zorp is a drink made by Quux Corp."),
                  ("Quux Corp", "Quux Corp was founded by Ann Lee in 1990."),
                  ("Ann Lee", "Ann Lee was born in Oslo."),
                  ("Oslo", "Oslo is a city."),
                  ("Other", "Nothing about the task here.")])), k=2)


# ----------------------------------------------------------------------------- the contract
def test_parse_action_by_hand():
    a = parse_action('Sure.\n```json\n{"action": "ASK", "question": " Who? ", "rationale": "r", "parent_uids": [1]}\n```')
    assert (a.kind, a.question, a.rationale, a.parent_uids, a.malformed) == ("ask", "Who?", "r", ("1",), False)
    assert parse_action('{"action":"Stop"}').kind == "stop" and not parse_action('{"action":"Stop"}').malformed
    for bad, why in (("no json here", "no JSON object"), ('{"action": "ask", "question": "  "}', "without a question"),
                     ('{"action": "jump"}', "expected ask or stop"), ('{"action": ask}', "invalid JSON")):
        a = parse_action(bad)
        assert a.kind == "stop" and a.malformed and why in a.reason, (bad, a)
    # the first balanced object, braces inside strings not counted
    assert first_json_object('x {"q": "a } b", "n": {"m": 1}} {"later": 2}') == '{"q": "a } b", "n": {"m": 1}}'


@given(st.text(max_size=60))
def test_parse_action_never_raises_and_asks_only_with_a_question(text):
    a = parse_action(text)
    assert a.kind in ("ask", "stop")
    assert a.kind == "stop" or (a.question and not a.malformed)


@given(q=st.text(min_size=1, max_size=40).filter(lambda s: s.strip()))
def test_ask_json_round_trips(q):
    a = parse_action("noise " + ask_json(q, "why") + " trailing")
    assert a.kind == "ask" and a.question == q.strip() and a.rationale == "why"


def test_the_prompt_sections_and_canonical_evidence_order():
    ev = [EvidenceView("t:10", "B", "x" * 1300), EvidenceView("t:2", "A", "short")]
    p = render_state(question="Q?", benchmark="musique", evidence=ev, draft="", history=[("q1", "a1")])
    assert p.index("Task: Q?") < p.index("Evidence so far") < p.index("Current draft") < p.index("Q1: q1\nA1: a1")
    assert p.index("[t:2] A") < p.index("[t:10] B")  # by id, not by arrival
    assert "x" * 1200 in p and "x" * 1201 not in p and "(no draft yet)" in p
    assert render_state(question="Q?", benchmark="musique", evidence=list(reversed(ev)), draft="",
                        history=[("q1", "a1")]) == p
    empty = render_state(question="Q?", benchmark="2wiki", evidence=[], draft="", history=[])
    assert "(nothing retrieved yet)" in empty and "(nothing asked yet)" in empty
    assert "budget" not in p.lower() and "turn" not in p.lower()


# ----------------------------------------------------------------------------- the episode
class Scripted:
    """A deterministic fake: replies from a list, one per decision."""

    name = "fake"

    def __init__(self, replies):
        self.replies = list(replies)
        self.calls = 0

    async def act(self, state, key):
        self.calls += 1
        return Reply(self.replies[state.turn] if state.turn < len(self.replies) else '{"action": "stop"}')


def _run(replies, **cfg):
    return asyncio.run(run_episode(TASK, Scripted(replies), ExtractiveDrafter(), ExtractiveAnswerer(), seed=0,
                                   key=jax.random.key(0), config=LoopConfig(**cfg)))


QUESTIONS = [ask_json(q) for q in ("Zorp drink", "Quux Corp founded", "Ann Lee born", "Oslo city", "Other task")]


def test_a_run_records_its_turns_and_stops_by_policy():
    r = _run(QUESTIONS[:2])
    assert r.stop_reason == "policy_stop" and r.n_asks == 2 and r.malformed == 0
    assert r.turns[0].retrieved[0] == 0 and r.turns[1].retrieved[0] == 1
    assert r.turns[1].new == tuple(i for i in r.turns[1].retrieved if i not in r.turns[0].retrieved)
    assert r.turns[1].reply == "Quux Corp was founded by Ann Lee in 1990." and r.answer and r.draft


def test_the_budget_stop_does_not_record_the_unexecuted_question():
    r = _run(QUESTIONS, cap=2)
    assert r.stop_reason == "budget" and r.n_asks == 2 and [t.question for t in r.turns] == ["Zorp drink",
                                                                                           "Quux Corp founded"]
    assert _run(QUESTIONS, cap=0).n_asks == 0 and _run(QUESTIONS, cap=0).stop_reason == "budget"
    assert _run(QUESTIONS, max_turns=3).stop_reason == "max_turns" and _run(QUESTIONS, max_turns=3).n_asks == 3


def test_a_malformed_reply_is_a_counted_stop():
    r = _run([QUESTIONS[0], "I think we should look at Oslo"])
    assert r.stop_reason == "policy_stop" and r.malformed == 1 and r.n_asks == 1


def test_a_cap_k_run_is_the_prefix_of_a_cap_8_run():
    full = _run(QUESTIONS, cap=8)
    for k in range(0, 6):
        capped = _run(QUESTIONS, cap=k)
        assert capped.turns == full.prefix(k).turns, k
        assert full.prefix(k).stop_reason == ("budget" if k < full.n_asks else full.stop_reason)


def test_the_decision_prompts_are_replayed_from_the_transcript():
    # a training row needs (prompt, reply) per decision: re-rendered from the run, they are what the
    # questioner saw
    class Recording(Scripted):
        def __init__(self, replies):
            super().__init__(replies)
            self.seen = []

        async def act(self, state, key):
            self.seen.append(state.prompt)
            return await super().act(state, key)

    for replies, cfg in ((QUESTIONS[:3], {}), (QUESTIONS, {"cap": 2}), (QUESTIONS, {"max_turns": 4}),
                         ([QUESTIONS[0], "not json"], {})):
        q = Recording(replies)
        run = asyncio.run(run_episode(TASK, q, ExtractiveDrafter(), ExtractiveAnswerer(), seed=0,
                                      key=jax.random.key(0), config=LoopConfig(**cfg)))
        rows = decision_prompts(run, TASK)
        assert [p for p, _ in rows] == q.seen, cfg
        assert [r for _, r in rows] == [q.replies[t] if t < len(q.replies) else '{"action": "stop"}'
                                        for t in range(len(rows))]


def test_a_failing_drafter_marks_the_run_failed_after_retries():
    class Broken(ExtractiveDrafter):
        calls = 0

        async def resolve(self, task, held, question):
            Broken.calls += 1
            raise ConnectionError("down")

    r = asyncio.run(run_episode(TASK, Scripted(QUESTIONS), Broken(), ExtractiveAnswerer(), seed=0,
                                key=jax.random.key(0), config=LoopConfig(retries=2)))
    assert r.failed and "drafter.resolve: ConnectionError: down" in r.error and Broken.calls == 3


def test_transcripts_round_trip(tmp_path):
    runs = [_run(QUESTIONS[:3]), _run([])]
    assert read_runs(write_runs(runs, tmp_path / "r.jsonl")) == runs
    line = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert line["n_asks"] == 3 and line["turns"][0]["retrieved"] == list(runs[0].turns[0].retrieved)
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: expected a QDRun"):
        read_runs(tmp_path / "bad.jsonl")


def test_stop_reason_is_checked():
    with pytest.raises(ValueError, match="stop_reason='later'"):
        QDRun("musique", "t", 0, "x", (), "later")


# ----------------------------------------------------------------------------- the roles
def test_offline_stand_ins_by_hand():
    units = list(TASK.pool)
    assert best_sentence(units, "who founded Quux") == "Quux Corp was founded by Ann Lee in 1990."
    assert best_sentence(units, "zzz") == ""
    d = ExtractiveDrafter()
    assert asyncio.run(d.draft(TASK, [units[1], units[0]])) == asyncio.run(d.draft(TASK, [units[0], units[1]]))
    # "zorp" and "founded" each share one word with the task question: the tie goes to the earliest
    assert asyncio.run(ExtractiveAnswerer().answer(TASK, units, "")).text == "Zorp is a drink made by Quux Corp."
    long = QATask("2wiki", "w", "alpha beta", "x", (), (Unit(0, "0", "T", "alpha beta " * 40 + "."),), k=1)
    assert len(asyncio.run(ExtractiveAnswerer().answer(long, list(long.pool), "")).text.split()) == 30
    assert "offline stand-in" in d.name and "offline stand-in" in ExtractiveAnswerer().name


def test_never_ask_stops_at_once():
    r = asyncio.run(run_episode(TASK, NeverAsk(), ExtractiveDrafter(), ExtractiveAnswerer(), seed=0,
                                key=jax.random.key(0)))
    assert r.n_asks == 0 and r.stop_reason == "policy_stop" and r.malformed == 0 and r.questioner == "never_ask"


def test_the_scripted_questioner_walks_the_chain():
    r = asyncio.run(run_episode(TASK, ScriptedQuestioner(), ExtractiveDrafter(), ExtractiveAnswerer(), seed=0,
                                key=jax.random.key(0)))
    assert r.turns[0].question == TASK.question
    assert {1, 2} <= r.held()  # the founder's paragraph, then the entity it names
    assert r.stop_reason == "policy_stop" and r.n_asks <= 8


def test_the_scripted_questioners_names_end_at_a_sentence_end():
    from jaxagent.qd.agents import _NAME

    names = [m.group(0) for m in _NAME.finditer(
        "The capital of Pougouia is Vituburg. Pougouia is a coastal country. J.R.R. Tolkien visited the Bank of "
        "England.")]
    assert names == ["The", "Pougouia", "Vituburg", "Pougouia", "J.R.R", "Tolkien", "Bank of England"]


def test_the_scripted_questioner_covers_real_tasks():
    from jaxagent.qd.graphs import build_graphs

    pairs = build_graphs("musique")[:20]
    runs = asyncio.run(run_suite([t for t, _ in pairs], ScriptedQuestioner(), ExtractiveDrafter(),
                                 ExtractiveAnswerer(), seeds=[0, 1], key=jax.random.key(0), concurrency=4))
    assert [(r.task_id, r.seed) for r in runs] == [(t.task_id, s) for t, _ in pairs for s in (0, 1)]
    cov = [len(g.required_evidence & r.held()) / len(g.required_evidence) for (t, g), r in zip(
        [p for p in pairs for _ in (0, 1)], runs)]
    assert 0.5 < sum(cov) / len(cov) < 1.0  # non-trivial on real data, not perfect
    assert load_suite("musique")[0][1].task_id == pairs[0][0].task_id


def test_a_local_policy_questioner_runs_through_the_engine():
    # a tiny random model: its replies are malformed (a counted policy stop); what is tested is the path
    from jaxagent.models import init_params, preset
    from jaxagent.models.generate import SamplingParams
    from jaxagent.rollout.engine import GenerationEngine
    from jaxagent.text import load_tokenizer
    from tests.conftest import FIXTURES

    tok = load_tokenizer(FIXTURES / "tokenizer_qwen")
    cfg = preset("tiny-qwen2", vocab_size=tok.vocab_size, max_position_embeddings=4096)
    engine = GenerationEngine(init_params(jax.random.key(0), cfg), cfg, slots=2, capacity=2048)
    q = PolicyQuestioner(engine, tok, SamplingParams(temperature=1.0, max_new_tokens=16,
                                                     stop_tokens=tuple(tok.eos_token_ids)), name="local:tiny")
    runs = asyncio.run(run_suite([TASK], q, ExtractiveDrafter(), ExtractiveAnswerer(), seeds=[0, 1],
                                 key=jax.random.key(0)))
    assert [r.questioner for r in runs] == ["local:tiny"] * 2
    for r in runs:
        assert r.tokens["questioner_prompt"] > 100 and 0 < r.tokens["questioner_completion"] <= 16 * (r.n_asks + 1)
        assert r.stop_reason in ("policy_stop", "budget", "max_turns")


def test_every_reading_has_a_known_answer_on_synthetic_tasks():
    # an oracle asks for each hop's paragraph by its title (k = 1: exactly that paragraph), in the
    # lines' order or reversed; on 3-hop x 2-line tasks the readings follow by hand
    class Oracle:
        name = "oracle"

        def __init__(self, titles):
            self.titles = titles

        async def act(self, state, key):
            t = state.turn
            return Reply(ask_json(f"What is known about {self.titles[t]}?") if t < len(self.titles)
                         else '{"action": "stop"}')

    for rec in generate(12, depth=3, breadth=2, seed=1, join="question"):
        task = dataclasses.replace(musique_task(rec, "synthetic"), k=1)
        g = musique_graph(rec, task)
        titles = [task.pool[s["paragraph_support_idx"]].title for s in rec["question_decomposition"]]
        for order, ooo in ((titles, 0.0), (titles[::-1], 1.0)):  # reversed: every prerequisite comes after
            r = asyncio.run(run_episode(task, Oracle(order), ExtractiveDrafter(), ExtractiveAnswerer(), seed=0,
                                        key=jax.random.key(0)))
            assert r.n_asks == 6 and [len(t.retrieved) for t in r.turns] == [1] * 6
            assert (M.coverage(r, g), M.dwr(r, g), M.deepest_resolved(r, g), M.breadth(r, g)) == (1.0, 1.0, 2, 2)
            assert M.out_of_order(r, g) == M.out_of_order(r, g, per="need") == ooo
            assert M.coverage_ladder(r, g) == pytest.approx([t / 6 for t in range(7)])
            cells = M.stop_cells(r, g)
            assert (cells.n_done, cells.n_stop_at_done, cells.n_not_done, cells.n_ask_at_not_done) == (1, 1, 6, 6)
            # prefix 3: one whole line (forward: depths 0, 1, 2 of line 1; reversed: of line 2)
            assert (M.coverage(r, g, 3), M.dwr(r, g, 3), M.breadth(r, g, 3), M.deepest_resolved(r, g, 3)) == (
                0.5, 0.5, 1, 2)


class _ChatServer(LoopbackServer):
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1 that plays every role: as questioner
    it asks two fixed questions then stops; as drafter or answerer it echoes a short text. Each
    reply reports usage (prompt tokens = the prompt's words, completion tokens = 7)."""

    def __init__(self):
        self.release = threading.Event()
        self.prompts = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                server.prompts.append(prompt)
                if "Reply with exactly one JSON object" in prompt:
                    asked = len(re.findall(r"^Q\d+: ", prompt, flags=re.MULTILINE))
                    text = ask_json(["Zorp drink", "Quux Corp founded"][asked]) if asked < 2 else '{"action":"stop"}'
                else:
                    text = "Ann Lee founded it."
                out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}],
                                  "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 7}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._serve(Handler)


def test_endpoint_roles_over_http_count_the_servers_tokens():
    from jaxagent.envs.llm_user import LLMUserClient, LLMUserConfig
    from jaxagent.qd.agents import EndpointAnswerer, EndpointDrafter, EndpointQuestioner

    server = _ChatServer()
    try:
        async def main():
            client = LLMUserClient(LLMUserConfig(base_url=server.base_url, model="m", max_retries=0))
            try:
                return await run_episode(TASK, EndpointQuestioner(client), EndpointDrafter(client),
                                         EndpointAnswerer(client), seed=0, key=jax.random.key(0))
            finally:
                await client.aclose()

        r = asyncio.run(main())
    finally:
        server.close()
    assert [t.question for t in r.turns] == ["Zorp drink", "Quux Corp founded"] and r.stop_reason == "policy_stop"
    assert r.questioner == r.drafter == r.answerer == "endpoint:m" and r.answer == "Ann Lee founded it."
    # 3 questioner calls, 2 x (resolve + draft), 1 answer: every call's usage lands in its role's counts
    assert len(server.prompts) == 8
    assert (r.tokens["questioner_completion"], r.tokens["drafter_completion"], r.tokens["answerer_completion"]) == (
        21, 28, 7)
    words = [len(p.split()) for p in server.prompts]
    assert sum(r.tokens[k] for k in ("questioner_prompt", "drafter_prompt", "answerer_prompt")) == sum(words)
