"""The in-flight generation engine: same tokens as the batch generator, more sessions than slots,
prefix reuse across turns, and eviction falling back to a full prefill."""

import asyncio
import time
from collections import Counter

import jax
import jax.numpy as jnp
import pytest
import numpy as np

from jaxagent.models import init_params, preset
from jaxagent.models.generate import SamplingParams, generate_from_prompts
from jaxagent.rollout.engine import GenerationEngine

CFG = preset("tiny-qwen3", vocab_size=64, max_position_embeddings=256)
PARAMS = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(jax.random.key(0), CFG))


def _reference(prompt, sp, key):
    out, _ = generate_from_prompts(PARAMS, [prompt], config=CFG, sampling=sp, key=key)
    n = int(out.num_tokens[0])
    return np.asarray(out.tokens[0, :n]).tolist(), np.asarray(out.logp_policy[0, :n])


@pytest.mark.parametrize("decode_steps", [1, 8])
def test_more_sessions_than_slots_match_the_batch_generator(decode_steps):
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12], [13, 14, 15]]
    sps = [SamplingParams(temperature=0.0, max_new_tokens=5 + i, stop_tokens=(3,)) for i in range(len(prompts))]

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=2, capacity=32, decode_steps=decode_steps)
        keys = [jax.random.key(i) for i in range(len(prompts))]
        return await asyncio.gather(*(engine.generate(f"s{i}", p, sp, k)
                                      for i, (p, sp, k) in enumerate(zip(prompts, sps, keys))))

    results = asyncio.run(main())
    for i, (prompt, sp, res) in enumerate(zip(prompts, sps, results)):
        toks, lp = _reference(prompt, sp, jax.random.key(0))
        assert res.tokens == toks, i
        np.testing.assert_allclose(res.logp_policy, lp, atol=1e-5)
        assert res.stopped == (toks[-1] == 3)


def test_sampling_uses_the_request_key_like_generate():
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=6)

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=3, capacity=32)
        return await engine.generate("a", [1, 2, 3], sp, jax.random.fold_in(jax.random.key(5), 0))

    res = asyncio.run(main())
    toks, _ = _reference([1, 2, 3], sp, jax.random.key(5))  # row 0 of generate_from_prompts: fold_in(key, 0)
    assert res.tokens == toks


def test_prefix_reuse_across_turns_and_eviction():
    sp = SamplingParams(temperature=0.0, max_new_tokens=4)

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=1, capacity=64)
        key = jax.random.key(0)
        first = await engine.generate("a", [1, 2, 3, 4], sp, key)
        turn2 = [1, 2, 3, 4] + first.tokens + [20, 21]
        second = await engine.generate("a", turn2, sp, key)
        # another session takes the only slot: "a" is evicted and must prefill in full
        await engine.generate("b", [5, 6], sp, key)
        turn3 = turn2 + second.tokens + [22]
        third = await engine.generate("a", turn3, sp, key)
        return first, second, third, turn2, turn3

    first, second, third, turn2, turn3 = asyncio.run(main())
    assert first.prefill_tokens == 4
    assert second.prefill_tokens == 3  # the last generated token and the two new ones
    assert third.prefill_tokens == len(turn3)  # evicted: full prefill
    assert second.tokens == _reference(turn2, sp, jax.random.key(0))[0]
    assert third.tokens == _reference(turn3, sp, jax.random.key(0))[0]


def test_parked_prefix_is_restored_instead_of_prefilled():
    sp = SamplingParams(temperature=0.0, max_new_tokens=4)

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=1, capacity=64, park_rows=1)
        key = jax.random.key(0)
        first = await engine.generate("a", [1, 2, 3, 4], sp, key)
        turn2 = [1, 2, 3, 4] + first.tokens + [20, 21]
        await engine.generate("b", [5, 6], sp, key)  # "a" is parked
        second = await engine.generate("a", turn2, sp, key)  # "b" is parked, "a" restored
        third = await engine.generate("b", [5, 6, 7], sp, key)  # "b" restored, "a" parked
        engine.release("a")
        return first, second, third, turn2, dict(engine.stats), engine.parked

    first, second, third, turn2, stats, parked = asyncio.run(main())
    assert second.prefill_tokens == 3  # the last generated token and the two new ones
    assert third.prefill_tokens == 1  # [5, 6] came back from the park row
    assert second.tokens == _reference(turn2, sp, jax.random.key(0))[0]
    assert third.tokens == _reference([5, 6, 7], sp, jax.random.key(0))[0]
    assert stats["parked"] == 3 and stats["restored"] == 2
    assert not parked  # released sessions leave nothing parked


def test_a_prefill_call_changes_only_its_admitted_rows():
    # the engine's prefill against the naive one: `extend` over every lane with n_new = 0 elsewhere
    from jaxagent.models.generate import extend, init_cache
    from jaxagent.rollout.engine import _prefill

    S, C = 4, 48
    rng = np.random.default_rng(0)
    cache = init_cache(CFG, S, C)
    logits, cache = extend(PARAMS, cache, rng.integers(1, 60, (S, 20)), np.array([20, 12, 7, 16]), config=CFG)
    pending = logits + 1.0  # lanes' pending logits, to be kept where not admitted
    rows = np.array([2, 0, S, S], np.int32)  # lanes 2 and 0 admitted, two padding entries
    toks = rng.integers(1, 60, (4, 16)).astype(np.int32)
    n_new = np.array([9, 16, 0, 0], np.int32)
    rollback = np.array([3, 20, 0, 0], np.int32)  # lane 2 keeps 3 of its 7, lane 0 all 20
    want_toks = np.zeros((S, 16), np.int32)
    want_toks[2], want_toks[0] = toks[0], toks[1]
    want_n = np.array([16, 0, 9, 0], np.int32)
    naive = cache._replace(lengths=np.array([20, 12, 3, 16], np.int32))
    want_logits, want = extend(PARAMS, jax.tree.map(jnp.copy, naive), want_toks, want_n, config=CFG)
    got_logits, got = _prefill(PARAMS, jax.tree.map(jnp.copy, cache), rows, toks, n_new, rollback, pending,
                               config=CFG, window=64 if C >= 64 else C)
    assert np.asarray(got.lengths).tolist() == [36, 12, 12, 16]
    for lane, n in ((0, 36), (2, 12)):  # admitted: what the naive prefill wrote, and its logits
        np.testing.assert_allclose(np.asarray(got.k[:, lane, :n]), np.asarray(want.k[:, lane, :n]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(got.v[:, lane, :n]), np.asarray(want.v[:, lane, :n]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(got_logits[lane]), np.asarray(want_logits[lane]), atol=1e-4)
    for lane in (1, 3):  # not admitted: bit for bit as before, pending logits kept
        assert np.array_equal(np.asarray(got.k[:, lane]), np.asarray(cache.k[:, lane]))
        assert np.array_equal(np.asarray(got.v[:, lane]), np.asarray(cache.v[:, lane]))
        assert np.array_equal(np.asarray(got_logits[lane]), np.asarray(pending[lane]))


def test_engine_rejects_bad_sizes():
    with pytest.raises(ValueError, match="park_rows=-1"):
        GenerationEngine(PARAMS, CFG, slots=1, capacity=32, park_rows=-1)
    with pytest.raises(ValueError, match="decode_steps=0"):
        GenerationEngine(PARAMS, CFG, slots=1, capacity=32, decode_steps=0)


def test_warmup_compiles_without_changing_what_the_engine_generates():
    sp = SamplingParams(temperature=0.0, max_new_tokens=5)

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=2, capacity=32, park_rows=2, decode_steps=4)
        engine.warmup()
        res = await engine.generate("a", [1, 2, 3], sp, jax.random.key(0))
        with pytest.raises(RuntimeError, match="warmup"):
            engine.warmup()  # a used engine: its rows hold a session
        return res

    res = asyncio.run(main())
    assert res.tokens == _reference([1, 2, 3], sp, jax.random.key(0))[0]


def test_a_failing_engine_step_fails_its_requests_and_the_engine_recovers():
    sp = SamplingParams(temperature=0.0, max_new_tokens=3)

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=2, capacity=32)
        real = engine._step

        def broken(admitted):
            raise FloatingPointError("injected")

        engine._step = broken
        results = await asyncio.gather(engine.generate("a", [1, 2], sp, jax.random.key(0)),
                                       engine.generate("b", [3], sp, jax.random.key(0)), return_exceptions=True)
        engine._step = real
        again = await engine.generate("a", [1, 2], sp, jax.random.key(0))
        return results, again

    results, again = asyncio.run(asyncio.wait_for(main(), 120))
    assert all(isinstance(r, RuntimeError) and "injected" in str(r) for r in results)
    assert again.tokens == _reference([1, 2], sp, jax.random.key(0))[0]


def _admissions_and_results(host_s: float):
    """Six sessions of staggered lengths over three lanes and two park rows; between turns each
    spends a few event-loop turns (and, with ``host_s``, wall time in each) as a scripted user and
    the renderer do. Returns (the sessions admitted per engine call, each session's turns)."""
    engine = GenerationEngine(PARAMS, CFG, slots=3, capacity=64, park_rows=2, decode_steps=2)
    calls = []
    step = engine._step

    def logged(admitted):
        calls.append(sorted(r.session for r in admitted))
        # the settle's count per boundary is the sessions still out with a result of that boundary
        assert engine._awaited == Counter(engine._delivered.values())
        return step(admitted)

    engine._step = logged

    async def session(i):
        prompt, turns = [1 + i, 2, 3], []
        for turn in range(3):
            sp = SamplingParams(temperature=1.0, max_new_tokens=2 + (5 * i + 3 * turn) % 9)
            res = await engine.generate(f"s{i}", prompt, sp, jax.random.fold_in(jax.random.key(i), turn))
            turns.append((res.tokens, res.logp_policy))
            for _ in range(4):  # the way back: a few event-loop turns, slow ones with host_s
                time.sleep(host_s)
                await asyncio.sleep(0)
            prompt = prompt + res.tokens + [5, 6 + turn]
        engine.release(f"s{i}")
        return turns

    async def main():
        return await asyncio.gather(*(session(i) for i in range(6)))

    results = asyncio.run(main())
    assert not engine._delivered and not engine._awaited  # every session came back or was released
    return calls, results


def test_admission_does_not_depend_on_how_fast_sessions_come_back():
    # Which requests share an engine call changes the float rounding (window, prefill width):
    # sessions slower to come back than an engine call (a loaded machine) must still join the
    # call they join when they come back at once, or a rollout would not replay exactly.
    calls, results = _admissions_and_results(0.0)
    slow_calls, slow_results = _admissions_and_results(0.01)
    assert slow_calls == calls
    assert slow_results == results


def test_streamed_tokens_add_up_to_the_result_and_arrive_per_call():
    sp = SamplingParams(temperature=1.0, max_new_tokens=11)
    seen = []

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=2, capacity=32, decode_steps=4)
        res = await engine.generate("a", [1, 2, 3], sp, jax.random.key(3),
                                    on_tokens=lambda toks, lps: seen.append((list(toks), list(lps))))
        return res, engine.stats["engine_calls"]

    res, calls = asyncio.run(main())
    assert [t for toks, _ in seen for t in toks] == res.tokens
    np.testing.assert_array_equal([v for _, lps in seen for v in lps], res.logp_policy)
    assert [len(toks) for toks, _ in seen] == [4, 4, 3] and calls == 3  # one callback per engine call


async def _cancelled_after(engine, n: int) -> list[int]:
    """Session "a" asks for 20 greedy tokens after [1, 2, 3]; its caller cancels once ``n`` have
    streamed. Returns the tokens it got."""
    got = []
    task = asyncio.ensure_future(engine.generate("a", [1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=20),
                                                 jax.random.key(0), on_tokens=lambda t, _: got.extend(t)))
    while len(got) < n:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return got


def test_a_cancelled_request_frees_its_lane_and_keeps_its_prefix():
    short = SamplingParams(temperature=0.0, max_new_tokens=2)

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=1, capacity=64, decode_steps=2)
        got = await _cancelled_after(engine, 4)
        # the only lane is free again: another session is served, then "a" comes back with what it had
        other = await engine.generate("b", [4, 5], short, jax.random.key(1))
        before = engine.stats["prefill_tokens"]
        again = await engine.generate("a", [1, 2, 3] + got + [7], short, jax.random.key(2))
        return got, other, again, engine.stats["prefill_tokens"] - before, engine

    got, other, again, prefilled, engine = asyncio.run(main())
    assert 4 <= len(got) < 20 and len(other.tokens) == 2 and len(again.tokens) == 2
    assert all(r is None for r in engine.running) and not engine.pending
    # "b" took the lane after the cancel (no park rows), so "a" comes back as a full prefill, and its
    # tokens are a fresh engine's
    ref = asyncio.run(GenerationEngine(PARAMS, CFG, slots=1, capacity=64).generate(
        "z", [1, 2, 3] + got + [7], short, jax.random.key(2)))
    assert again.tokens == ref.tokens and prefilled == len(got) + 4


def test_a_cancelled_request_keeps_its_own_lane_for_the_next_turn():
    short = SamplingParams(temperature=0.0, max_new_tokens=2)

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=2, capacity=64, decode_steps=2)
        got = await _cancelled_after(engine, 4)
        before = engine.stats["prefill_tokens"]
        nxt = await engine.generate("a", [1, 2, 3] + got + [7, 8], short, jax.random.key(2))
        return nxt, engine.stats["prefill_tokens"] - before

    nxt, prefilled = asyncio.run(main())
    assert prefilled == 2  # only the new tokens: the cancelled request's prompt and output stayed in its lane
    assert len(nxt.tokens) == 2


PARAMS_B = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(jax.random.key(1), CFG))


def _reference_with(params, prompt, sp):
    out, _ = generate_from_prompts(params, [prompt], config=CFG, sampling=sp, key=jax.random.key(0))
    return np.asarray(out.tokens[0, : int(out.num_tokens[0])]).tolist()


def test_published_weights_reach_the_next_turns_and_the_running_turn_keeps_its_own():
    # asynchronous RL's partial rollouts: weights published while a turn decodes apply at the first
    # call boundary with nothing running; every result is tagged with the version that generated it
    sp = SamplingParams(temperature=0.0, max_new_tokens=12)
    published = []

    async def main():
        engine = GenerationEngine(PARAMS, CFG, slots=1, capacity=64, decode_steps=1)

        def on_tokens(new, lps):
            if not published:  # after the running turn's first engine call
                engine.publish(PARAMS_B, 7)
                published.append(len(new))

        first = asyncio.ensure_future(engine.generate("s", [1, 2, 3], sp, jax.random.key(0), on_tokens=on_tokens))
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(engine.generate("t", [4, 5], sp, jax.random.key(0)))  # no free lane: waits
        a, b = await first, await waiting
        assert engine.version == 7
        c = await engine.generate("s", [1, 2, 3] + a.tokens + [6], sp, jax.random.key(0))  # the session's next turn
        return a, b, c

    a, b, c = asyncio.run(main())
    assert published == [1]
    assert a.tokens == _reference_with(PARAMS, [1, 2, 3], sp) and a.version == 0  # the whole turn under A
    assert b.tokens == _reference_with(PARAMS_B, [4, 5], sp) and b.version == 7
    # the session's cached prefix was A's: forgotten, so its next turn is prefilled whole under B
    assert c.tokens == _reference_with(PARAMS_B, [1, 2, 3] + a.tokens + [6], sp) and c.version == 7
    assert c.prefill_tokens == len(a.tokens) + 4
    assert _reference_with(PARAMS, [4, 5], sp) != b.tokens  # the two weights do differ here


def test_set_params_tags_versions_and_publish_without_requests_applies_at_once():
    sp = SamplingParams(temperature=0.0, max_new_tokens=3)
    engine = GenerationEngine(PARAMS, CFG, slots=2, capacity=32)
    assert engine.version == 0
    engine.set_params(PARAMS)
    assert engine.version == 0  # untold: 0 (evaluations); RL passes the updates made
    engine.set_params(PARAMS_B, version=5)
    engine.publish(PARAMS, 9)  # nothing in flight: at once
    assert engine.version == 9 and engine.params is PARAMS
    res = asyncio.run(engine.generate("a", [1, 2], sp, jax.random.key(0)))
    assert res.version == 9 and res.tokens == _reference_with(PARAMS, [1, 2], sp)


def _on_mesh(fsdp: int):
    """PARAMS laid out as a run lays them out on a mesh of ``fsdp`` of the simulated devices."""
    from jaxagent.models import LogicalRules, MeshConfig, make_mesh
    from jaxagent.models.qwen import param_logical_axes

    rules = LogicalRules(make_mesh(MeshConfig(fsdp=fsdp), jax.devices()[:fsdp]))
    shard = jax.tree.map(lambda ax, x: rules.sharding(ax, x.shape), param_logical_axes(CFG), PARAMS,
                         is_leaf=lambda x: isinstance(x, tuple))
    return jax.device_put(PARAMS, shard)


def test_caches_split_over_kv_heads_generate_what_the_replicated_caches_do():
    """rollout.cache_sharding=heads: on 2 devices each holds 1 of the tiny model's 2 KV heads of every
    lane and parked row, and sessions (more than lanes: parked, restored, prefix reused) get the
    tokens the replicated caches give."""
    params = _on_mesh(2)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    sp = SamplingParams(temperature=0.0, max_new_tokens=6)

    async def play(how):
        engine = GenerationEngine(params, CFG, slots=2, capacity=48, park_rows=2, decode_steps=4, cache_sharding=how)
        first = await asyncio.gather(*(engine.generate(f"s{i}", p, sp, jax.random.key(i)) for i, p in enumerate(prompts)))
        again = await asyncio.gather(*(engine.generate(f"s{i}", p + r.tokens + [20 + i], sp, jax.random.key(i))
                                       for i, (p, r) in enumerate(zip(prompts, first))))
        return engine, first + again

    heads, got = asyncio.run(play("heads"))
    _, want = asyncio.run(play("replicated"))
    for g, w in zip(got, want):
        assert g.tokens == w.tokens and g.prefill_tokens == w.prefill_tokens
        np.testing.assert_allclose(g.logp_policy, w.logp_policy, atol=1e-5)
    assert heads.stats["restored"] > 0  # parked rows came back through the split park cache
    L, S, C, K, H = heads.cache.k.shape
    for cache in (heads.cache, heads.park):
        for arr in (cache.k, cache.v):
            assert {s.data.shape for s in arr.addressable_shards} == {(L, arr.shape[1], C, K // 2, H)}
    assert heads.cache.k.sharding.spec[3] in ("fsdp", ("fsdp",))  # the split survives the calls (donated, aliased)


def test_caches_split_over_heads_need_a_device_count_that_divides_them():
    from jaxagent.rollout.engine import engine_cache_sharding

    assert engine_cache_sharding(PARAMS, CFG, "heads") is None  # one device: nothing to split
    assert engine_cache_sharding(_on_mesh(2), CFG, "replicated") is None
    with pytest.raises(ValueError, match=r"cache_sharding='heads': the model's 2 KV heads do not split over the 4 dev"):
        engine_cache_sharding(_on_mesh(4), CFG, "heads")
    with pytest.raises(ValueError, match=r"rollout.cache_sharding='rows': expected one of 'replicated', 'heads'"):
        engine_cache_sharding(PARAMS, CFG, "rows")


def test_a_run_whose_mesh_cannot_split_the_heads_is_a_config_error_naming_the_key():
    from jaxagent import configlib
    from jaxagent.jobs.build import build_engine
    from jaxagent.jobs.config import load_config

    with pytest.raises(configlib.ConfigError, match=r"rollout.cache_sharding='rows': expected 'replicated' or 'heads'"):
        load_config(None, ["rollout.cache_sharding=rows"])
    cfg = load_config(None, ["rollout.cache_sharding=heads", "rollout.slots=2", "rollout.capacity=32",
                             "rollout.max_tokens=32"])
    with pytest.raises(configlib.ConfigError, match=r"2 KV heads do not split over the 4 devices"):
        build_engine(cfg, _on_mesh(4), CFG, park_rows=0, vocab_limit=64)
    engine = build_engine(cfg, _on_mesh(2), CFG, park_rows=1, vocab_limit=64)
    assert engine.kv_sharding is not None and engine.park.k.sharding == engine.kv_sharding
