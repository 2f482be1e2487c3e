"""KV-cache generation: agreement with teacher forcing, cache extension, sampling filters,
determinism, stop rules, in-place cache updates, sharding and input errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import LogicalRules, MeshConfig, forward, init_params, make_mesh, preset, shard_params, token_logprobs
from jaxagent.models.generate import (
    SamplingParams,
    check_fits,
    extend,
    filter_logits,
    generate_from_prompts,
    init_cache,
    jit_extend,
    jit_generate,
    pad_prompts,
    sample,
)

CFG2 = preset("tiny-qwen2", vocab_size=64, max_position_embeddings=128)
CFG3 = preset("tiny-qwen3", vocab_size=64, max_position_embeddings=128)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [10, 11, 12, 13]]


def _params(cfg, seed=0):
    p = init_params(jax.random.key(seed), cfg)
    return jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, p)  # far from uniform logits


def _teacher_forced(params, cfg, prompt, new):
    seq = jnp.asarray([list(prompt) + list(new)])
    logits = forward(params, seq, config=cfg)[0]
    lp = token_logprobs(params, seq, config=cfg)[0]
    P = len(prompt)
    return np.asarray(jnp.argmax(logits[P - 1 : -1], -1)), np.asarray(lp[P - 1 : -1])


@pytest.mark.parametrize("cfg", [CFG2, CFG3], ids=["qwen2", "qwen3"])
def test_greedy_equals_teacher_forced_argmax_and_logprobs(cfg):
    p = _params(cfg)
    out, lengths = generate_from_prompts(
        p, PROMPTS, config=cfg, sampling=SamplingParams(temperature=0.0, max_new_tokens=9), key=jax.random.key(0)
    )
    assert list(lengths) == [7, 2, 4]
    for b, prompt in enumerate(PROMPTS):
        new = np.asarray(out.tokens[b])
        argmax, lp = _teacher_forced(p, cfg, prompt, new)
        np.testing.assert_array_equal(argmax, new)
        np.testing.assert_allclose(np.asarray(out.logp_policy[b]), lp, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(out.logp_sample[b]), 0.0)  # greedy: point mass
    assert out.num_tokens.tolist() == [9, 9, 9] and not out.stopped.any()


def test_sampled_policy_logprobs_equal_teacher_forcing():
    cfg = CFG3
    p = _params(cfg, 1)
    out, _ = generate_from_prompts(
        p, PROMPTS, config=cfg, sampling=SamplingParams(temperature=1.3, top_k=10, top_p=0.9, max_new_tokens=8),
        key=jax.random.key(3),
    )
    for b, prompt in enumerate(PROMPTS):
        _, lp = _teacher_forced(p, cfg, prompt, np.asarray(out.tokens[b]))
        np.testing.assert_allclose(np.asarray(out.logp_policy[b]), lp, atol=1e-5)
        # The sampling log-prob: temperature, then top-k, then top-p, recomputed in numpy from
        # teacher-forced logits.
        seq = jnp.asarray([list(prompt) + np.asarray(out.tokens[b]).tolist()])
        logits = np.asarray(forward(p, seq, config=cfg)[0, len(prompt) - 1 : -1], np.float64) / 1.3
        for t, tok in enumerate(np.asarray(out.tokens[b])):
            order = np.argsort(-logits[t])[:10]
            probs = np.exp(logits[t][order] - logits[t][order].max())
            probs /= probs.sum()
            keep = (np.cumsum(probs) - probs) < 0.9
            kept = order[keep]
            assert tok in kept
            pk = np.exp(logits[t][kept] - logits[t][kept].max())
            want = np.log(pk[list(kept).index(tok)] / pk.sum())
            assert abs(float(out.logp_sample[b, t]) - want) < 1e-4


def test_extending_a_cache_equals_prefilling_from_scratch():
    cfg = CFG3
    p = _params(cfg)
    first = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    second = [[10, 11], [12], [13, 14, 15, 16]]
    ext = jit_extend(cfg)
    cache = init_cache(cfg, 3, 16)
    t1, n1 = pad_prompts(first)
    _, cache = ext(p, cache, jnp.asarray(t1), jnp.asarray(n1))
    t2, n2 = pad_prompts(second)
    logits_ext, cache_ext = ext(p, cache, jnp.asarray(t2), jnp.asarray(n2))

    whole = [a + b for a, b in zip(first, second)]
    tw, nw = pad_prompts(whole)
    logits_full, cache_full = ext(p, init_cache(cfg, 3, 16), jnp.asarray(tw), jnp.asarray(nw))
    np.testing.assert_allclose(logits_ext, logits_full, atol=1e-5)
    assert cache_ext.lengths.tolist() == cache_full.lengths.tolist() == [5, 6, 5]
    for b, n in enumerate(nw):
        np.testing.assert_allclose(cache_ext.k[:, b, :n], cache_full.k[:, b, :n], atol=1e-5)
        np.testing.assert_allclose(cache_ext.v[:, b, :n], cache_full.v[:, b, :n], atol=1e-5)
    # ... and both equal the plain forward's last-position logits.
    for b, seq in enumerate(whole):
        ref = forward(p, jnp.asarray([seq]), config=cfg)[0, -1]
        np.testing.assert_allclose(logits_full[b], ref, atol=1e-4)


def test_generation_continues_from_an_extended_cache():
    """Multi-turn reuse: generate, append the last token and a new message, generate again;
    the second answer equals generating from the whole conversation prefilled from scratch."""
    cfg = CFG2
    p = _params(cfg, 2)
    sp = SamplingParams(temperature=0.0, max_new_tokens=4)
    out1, _ = generate_from_prompts(p, [[1, 2, 3]], config=cfg, sampling=sp, key=jax.random.key(0), capacity=32)
    turn1 = out1.tokens[0].tolist()
    cache = out1.cache  # holds the prompt and all generated tokens but the last
    assert cache.lengths.tolist() == [3 + 3]
    user = [turn1[-1], 20, 21, 22]
    logits, cache = jit_extend(cfg)(p, cache, jnp.asarray([user]), jnp.asarray([len(user)]))
    out2 = jit_generate(cfg, 4)(p, cache, logits, jax.random.split(jax.random.key(0), 1), temperature_B=0.0)
    whole = [1, 2, 3] + turn1 + [20, 21, 22]
    ref, _ = generate_from_prompts(p, [whole], config=cfg, sampling=sp, key=jax.random.key(0))
    assert out2.tokens[0].tolist() == ref.tokens[0].tolist()


def test_same_key_same_output_and_rows_are_independent():
    cfg = CFG3
    p = _params(cfg)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)
    a, _ = generate_from_prompts(p, PROMPTS, config=cfg, sampling=sp, key=jax.random.key(7))
    b, _ = generate_from_prompts(p, PROMPTS, config=cfg, sampling=sp, key=jax.random.key(7))
    c, _ = generate_from_prompts(p, PROMPTS, config=cfg, sampling=sp, key=jax.random.key(8))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logp_sample, b.logp_sample)
    assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
    # A row's sample depends on its own key only, not on the rest of the batch.
    keys = jax.random.split(jax.random.key(7), 3)
    t, n = pad_prompts(PROMPTS)
    logits, cache = jit_extend(cfg)(p, init_cache(cfg, 3, 32), jnp.asarray(t), jnp.asarray(n))
    full = jit_generate(cfg, 10)(p, cache, logits, keys)
    t1, n1 = pad_prompts(PROMPTS[1:2])
    logits1, cache1 = jit_extend(cfg)(p, init_cache(cfg, 1, 32), jnp.asarray(t1), jnp.asarray(n1))
    alone = jit_generate(cfg, 10)(p, cache1, logits1, keys[1:2])
    np.testing.assert_array_equal(full.tokens[1], alone.tokens[0])


def test_stop_tokens_and_per_row_max_new_tokens():
    cfg = CFG2
    p = _params(cfg)
    greedy, _ = generate_from_prompts(
        p, PROMPTS, config=cfg, sampling=SamplingParams(temperature=0.0, max_new_tokens=8), key=jax.random.key(0)
    )
    stop = int(greedy.tokens[0, 2])  # row 0 will stop at its third token (or earlier)
    first = int(np.argmax(np.asarray(greedy.tokens[0]) == stop))
    t, n = pad_prompts(PROMPTS)
    logits, cache = jit_extend(cfg)(p, init_cache(cfg, 3, 32), jnp.asarray(t), jnp.asarray(n))
    out = jit_generate(cfg, 8, pad_id=63)(
        p, cache, logits, jax.random.split(jax.random.key(0), 3), temperature_B=0.0,
        max_new_B=jnp.asarray([8, 3, 8]), stop_tokens_BS=jnp.asarray([[stop, -1], [-1, -1], [-1, -1]]),
    )
    assert int(out.num_tokens[0]) == first + 1 and bool(out.stopped[0])
    np.testing.assert_array_equal(out.tokens[0, : first + 1], greedy.tokens[0, : first + 1])
    assert (np.asarray(out.tokens[0, first + 1 :]) == 63).all()
    assert int(out.num_tokens[1]) == 3 and not bool(out.stopped[1])
    np.testing.assert_array_equal(out.tokens[1, :3], greedy.tokens[1, :3])
    assert (np.asarray(out.logp_policy[1, 3:]) == 0).all()
    assert int(out.num_tokens[2]) == 8
    # The cache holds every generated token but the last: 1 + ... rows' lengths.
    assert out.cache.lengths.tolist() == [7 + first, 2 + 2, 4 + 7]


# ----------------------------------------------------------------------------- sampling filters
def test_filter_logits_hand_computed():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    one = jnp.ones((1,))

    def kept(tk, tp):
        return np.isfinite(np.asarray(filter_logits(logits, one, jnp.array([tk]), jnp.array([tp]))))[0].tolist()

    assert kept(0, 1.0) == [True] * 4
    assert kept(3, 1.0) == [True, True, True, False]
    assert kept(0, 0.7) == [True, True, False, False]  # 0.5 < 0.7 <= 0.8
    assert kept(0, 0.5) == [True, False, False, False]  # the first token alone reaches 0.5
    assert kept(0, 0.81) == [True, True, True, False]
    assert kept(2, 0.99) == [True, True, False, False]
    # Temperature 2 halves the logits.
    out = filter_logits(logits, jnp.array([2.0]), jnp.array([0]), jnp.array([1.0]))
    np.testing.assert_allclose(out, logits / 2, rtol=1e-6)


def test_sample_frequencies_match_the_filtered_distribution():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
    keys = jax.random.split(jax.random.key(0), 4000)
    ones = jnp.ones((4000,))
    tok, lp_s, lp_p = sample(logits, keys, ones, jnp.full((4000,), 2), ones)
    freq = np.bincount(np.asarray(tok), minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.625, 0.375, 0, 0], atol=0.03)  # renormalised top-2
    np.testing.assert_allclose(np.exp(np.asarray(lp_s))[np.asarray(tok) == 0], 0.625, rtol=1e-5)
    np.testing.assert_allclose(np.exp(np.asarray(lp_p))[np.asarray(tok) == 1], 0.3, rtol=1e-5)


def test_filtering_is_per_row_and_top_p_one_is_a_no_op():
    V = 4096
    logits = jax.random.normal(jax.random.key(0), (1, V)) * 6.0  # peaked: float32 cumsum reaches 1
    one = jnp.ones((1,))
    alone = filter_logits(logits, one, jnp.array([0]), jnp.array([1.0]))
    np.testing.assert_array_equal(alone, logits)
    both = filter_logits(jnp.concatenate([logits, logits]), jnp.ones((2,)), jnp.array([0, 0]), jnp.array([1.0, 0.5]))
    np.testing.assert_array_equal(both[0], logits[0])  # the other row's top_p does not touch this one
    assert int(np.isfinite(np.asarray(both[1])).sum()) < V
    k = filter_logits(logits, one, jnp.array([V - 1]), jnp.array([1.0]))
    assert int(np.isfinite(np.asarray(k)).sum()) == V - 1


def test_vocab_limit_is_never_sampled():
    logits = jnp.zeros((2000, 8)).at[:, 6:].set(5.0)  # ids 6, 7 are the most likely
    keys = jax.random.split(jax.random.key(0), 2000)
    ones = jnp.ones((2000,))
    tok, _, lp_p = sample(logits, keys, ones, jnp.zeros((2000,), jnp.int32), ones, vocab_limit=6)
    assert int(tok.max()) < 6
    np.testing.assert_allclose(lp_p, jax.nn.log_softmax(logits[0])[0], rtol=1e-6)  # policy: full softmax
    g, _, _ = sample(logits[:1], keys[:1], jnp.zeros((1,)), jnp.zeros((1,), jnp.int32), ones[:1], vocab_limit=6)
    assert int(g[0]) < 6


def test_full_cache_truncates_instead_of_overwriting():
    cfg = CFG2
    p = _params(cfg)
    t, n = pad_prompts([[1, 2, 3], [4]])
    logits, cache = jit_extend(cfg)(p, init_cache(cfg, 2, 6), jnp.asarray(t), jnp.asarray(n))
    out = jit_generate(cfg, 8)(p, cache, logits, jax.random.split(jax.random.key(0), 2), temperature_B=0.0)
    # Row 0 has 3 free slots: 3 tokens written, the 4th sampled from a full cache ends it.
    assert out.num_tokens.tolist() == [4, 6] and out.truncated.tolist() == [True, True]
    assert out.cache.lengths.tolist() == [6, 6]
    ref, _ = generate_from_prompts(p, [[1, 2, 3], [4]], config=cfg, key=jax.random.key(0),
                                   sampling=SamplingParams(temperature=0.0, max_new_tokens=8))
    np.testing.assert_array_equal(out.tokens[0, :4], ref.tokens[0, :4])
    np.testing.assert_array_equal(out.tokens[1, :6], ref.tokens[1, :6])
    assert not ref.truncated.any()
    # extend never counts tokens it could not write.
    _, cache = extend(p, init_cache(cfg, 1, 4), jnp.asarray([[1, 2, 3, 4, 5, 6]]), jnp.asarray([6]), config=cfg)
    assert cache.lengths.tolist() == [4]


def test_a_rows_sample_does_not_depend_on_the_batch_size():
    cfg = CFG3
    p = _params(cfg)
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    big, _ = generate_from_prompts(p, PROMPTS, config=cfg, sampling=sp, key=jax.random.key(2))
    small, _ = generate_from_prompts(p, PROMPTS[:1], config=cfg, sampling=sp, key=jax.random.key(2))
    np.testing.assert_array_equal(big.tokens[0], small.tokens[0])


def test_top_k_one_is_greedy():
    cfg = CFG3
    p = _params(cfg)
    g, _ = generate_from_prompts(p, PROMPTS, config=cfg, sampling=SamplingParams(0.0, max_new_tokens=5),
                                 key=jax.random.key(0))
    k1, _ = generate_from_prompts(p, PROMPTS, config=cfg, sampling=SamplingParams(1.0, top_k=1, max_new_tokens=5),
                                  key=jax.random.key(5))
    np.testing.assert_array_equal(g.tokens, k1.tokens)
    np.testing.assert_allclose(k1.logp_sample, 0.0, atol=1e-6)  # a one-token support


# ----------------------------------------------------------------------------- in place, sharded
def test_cache_is_donated_and_never_copied_whole():
    cfg = preset("tiny-qwen2", vocab_size=64, max_position_embeddings=4096, num_hidden_layers=4)
    B, S = 4, 4096
    p = jax.eval_shape(lambda: init_params(jax.random.key(0), cfg))
    cache = jax.eval_shape(lambda: init_cache(cfg, B, S))
    cache_bytes = 2 * cache.k.size * 4
    logits = jax.ShapeDtypeStruct((B, 64), jnp.float32)
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), B))
    mem = jit_generate(cfg, 8).lower(p, cache, logits, keys).compile().memory_analysis()
    assert mem.alias_size_in_bytes >= cache_bytes  # outputs reuse the donated cache buffers
    assert mem.temp_size_in_bytes < cache_bytes / 2  # no step materialises a second cache
    # And at run time the donated input is consumed.
    real = init_cache(CFG2, 1, 8)
    _, new = jit_extend(CFG2)(_params(CFG2), real, jnp.asarray([[1, 2]]), jnp.asarray([2]))
    assert real.k.is_deleted() and not new.k.is_deleted()


def test_sharded_generation_equals_single_device():
    cfg = CFG3
    p = _params(cfg)
    prompts = PROMPTS + [[3, 4], [5], [6, 7, 8], [1, 1, 1, 1], [2]]
    sp = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=6)
    ref, _ = generate_from_prompts(p, prompts, config=cfg, sampling=sp, key=jax.random.key(4))
    for mesh_cfg in (MeshConfig(data=2, fsdp=2, tensor=2), MeshConfig(data=1, fsdp=4, tensor=2)):
        rules = LogicalRules(make_mesh(mesh_cfg))
        ps = shard_params(p, cfg, rules)
        out, _ = generate_from_prompts(ps, prompts, config=cfg, sampling=sp, key=jax.random.key(4), rules=rules)
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_allclose(out.logp_policy, ref.logp_policy, atol=1e-5)
        assert len(out.cache.k.sharding.device_set) == 8


# ----------------------------------------------------------------------------- bad input
def test_bad_input_errors():
    p = _params(CFG2)
    with pytest.raises(ValueError, match=r"stop token 64: outside the vocabulary \[0, 64\)"):
        generate_from_prompts(p, PROMPTS, config=CFG2, sampling=SamplingParams(stop_tokens=(3, 64)),
                              key=jax.random.key(0))
    with pytest.raises(ValueError, match="prompts\\[0\\]: 7 tokens \\+ max_new_tokens=7 need 13 cache slots, more than the capacity 10"):
        generate_from_prompts(p, PROMPTS, config=CFG2, sampling=SamplingParams(max_new_tokens=7),
                              key=jax.random.key(0), capacity=10)
    with pytest.raises(ValueError, match="cache capacity=129"):
        init_cache(CFG2, 1, 129)
    with pytest.raises(ValueError, match="top_p=0"):
        SamplingParams(top_p=0).validate(64)
    with pytest.raises(ValueError, match="temperature=-1"):
        SamplingParams(temperature=-1).validate(64)
    with pytest.raises(ValueError, match=r"prompts\[1\]: token id 99 outside the vocabulary \[0, 64\)"):
        generate_from_prompts(p, [[1], [1, 99]], config=CFG2, sampling=SamplingParams(), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"prompts\[0\]: empty; expected at least one token"):
        generate_from_prompts(p, [[], [1, 2]], config=CFG2, sampling=SamplingParams(), key=jax.random.key(0))
    # Exactly enough room (prompt + max_new - 1 slots) is accepted, including at the position limit.
    out, _ = generate_from_prompts(p, [[i % 60 + 1 for i in range(64)]], config=CFG2, key=jax.random.key(0),
                                   sampling=SamplingParams(temperature=0.0, max_new_tokens=65))
    assert int(out.num_tokens[0]) == 65 and out.cache.capacity == 128
    with pytest.raises(ValueError, match="row 1: 30 cached"):
        check_fits([3, 30], [2, 5], 32)


def test_extend_never_clamps_writes_onto_valid_entries():
    """A padded column past the end of a nearly full row must be dropped, not written over the
    row's last valid positions (dynamic_update_slice would clamp the start index)."""
    cfg = CFG2
    p = _params(cfg)
    cache = init_cache(cfg, 2, 8)
    t, n = pad_prompts([[1, 2, 3, 4, 5, 6, 7], [1]])
    _, cache = jit_extend(cfg)(p, cache, jnp.asarray(t), jnp.asarray(n))
    before = np.asarray(cache.k[:, 0, :7])
    # Row 0 gets 1 new token; row 1 gets 5, so the batch is padded to T=5: row 0's columns 1..4
    # would land at positions 8..11, past the capacity of 8.
    _, cache = extend(p, cache, jnp.asarray([[9, 0, 0, 0, 0], [2, 3, 4, 5, 6]]), jnp.asarray([1, 5]), config=cfg)
    np.testing.assert_array_equal(np.asarray(cache.k[:, 0, :7]), before)
    assert cache.lengths.tolist() == [8, 6]


def test_windowed_extend_equals_the_full_cache_and_checks_the_window():
    """Attending over the first ``window`` positions gives the same logits and cache when every
    row fits in the window (the engine's bucketed decode)."""
    cfg = CFG2
    p = _params(cfg)
    first = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    second = [[10, 11], [12], [13, 14, 15, 16]]
    t1, n1 = pad_prompts(first)
    t2, n2 = pad_prompts(second)
    out = {}
    for window in (None, 8):
        fn = jax.jit(lambda p, c, t, n, w=window: extend(p, c, t, n, config=cfg, window=w))
        _, cache = fn(p, init_cache(cfg, 3, 32), jnp.asarray(t1), jnp.asarray(n1))
        out[window] = fn(p, cache, jnp.asarray(t2), jnp.asarray(n2))
    np.testing.assert_allclose(out[8][0], out[None][0], atol=1e-5)
    # Layer 0's new keys are bit-equal; deeper layers see attention outputs reduced over a
    # different key length, equal to float32 rounding.
    np.testing.assert_array_equal(out[8][1].k[0], out[None][1].k[0])
    np.testing.assert_allclose(out[8][1].k, out[None][1].k, atol=1e-5)
    np.testing.assert_allclose(out[8][1].v, out[None][1].v, atol=1e-5)
    assert out[8][1].lengths.tolist() == out[None][1].lengths.tolist() == [5, 6, 5]
    with pytest.raises(ValueError, match="window=64"):
        extend(p, init_cache(cfg, 1, 32), jnp.ones((1, 1), jnp.int32), jnp.ones((1,), jnp.int32), config=cfg,
               window=64)
