"""`jaxagent.rollout.processes` in one process: the shares partition the tasks, a block played
from its first group's index gives the whole list's episodes for those tasks, and the collectives
are the identity. (Two processes: tests/test_distributed.py runs a whole job.)"""

import asyncio

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxagent.envs.gyms import GYMS
from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.rollout.runner import EpisodeConfig
from jaxagent.rollout.loop import run_episodes
from jaxagent.rollout.processes import ProcessGroup, play_episodes
from jaxagent.text import load_tokenizer
from tests.conftest import FIXTURES

TOK = load_tokenizer(FIXTURES / "tokenizer_qwen")


@given(n=st.integers(0, 50), count=st.integers(1, 9))
def test_shares_partition_the_items_in_order(n, count):
    shares = [ProcessGroup(i, count).share(n) for i in range(count)]
    assert [i for r in shares for i in r] == list(range(n))  # contiguous blocks, in process order
    sizes = [len(r) for r in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_shares_by_hand():
    assert [ProcessGroup(i, 3).share(7) for i in range(3)] == [range(0, 3), range(3, 5), range(5, 7)]
    assert [ProcessGroup(i, 4).share(2) for i in range(4)] == [range(0, 1), range(1, 2), range(2, 2), range(2, 2)]


@pytest.mark.parametrize("index, count", [(1, 1), (-1, 2), (0, 0), (2, 2)])
def test_a_bad_process_group_is_refused(index, count):
    with pytest.raises(ValueError, match=f"index={index}, count={count}"):
        ProcessGroup(index, count)


def test_one_process_collectives_are_the_identity():
    g = ProcessGroup()
    assert g.is_main and not g.multi and g.gather({"a": 1}) == [{"a": 1}]
    g.check_same("x", np.arange(3))
    g.barrier("nothing")
    params = {"w": np.ones(2)}
    assert g.local_params(None)(params) is params


def _episodes(engine, tasks, sp, key, **kw):
    return asyncio.run(run_episodes(engine, GYMS["intention"].env, TOK, tasks, group_size=2, sampling=sp, key=key,
                                    config=EpisodeConfig(max_turns=3), **kw))


def test_a_block_from_its_first_group_gives_the_whole_lists_episodes():
    # what process i of a multi-process run plays (its share, first_group = the share's start) is
    # what one process playing every task produces for those tasks: group ids and episode keys
    cfg = preset("tiny-qwen2", vocab_size=TOK.vocab_size, max_position_embeddings=1024)
    engine = GenerationEngine(init_params(jax.random.key(0), cfg), cfg, slots=4, capacity=1024)
    tasks = GYMS["intention"].make_tasks("train", 3, seed=0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=tuple(TOK.eos_token_ids))
    key = jax.random.key(5)
    whole = _episodes(engine, tasks, sp, key)
    blocks = _episodes(engine, tasks[:2], sp, key) + _episodes(engine, tasks[2:], sp, key, first_group=2)
    assert [(t.task_id, t.group_id, t.tokens) for t in blocks] == [(t.task_id, t.group_id, t.tokens) for t in whole]
    shifted = _episodes(engine, tasks[2:], sp, key)  # without first_group: group 0's keys, another episode
    assert [t.group_id for t in shifted] == [0, 0] and [t.tokens for t in shifted] != [t.tokens for t in whole[4:]]
    played = play_episodes(engine, GYMS["intention"].env, TOK, tasks, group_size=2, sampling=sp, key=key,
                           config=EpisodeConfig(max_turns=3))
    assert [t.tokens for t in played] == [t.tokens for t in whole]
