"""The text layer and the KV-cache generator together, as the rollout engine will use them:
render -> prefill -> generate -> append the generated tokens verbatim -> add a tool result ->
extend the cache with only the new tokens -> generate again; then score the finished record
with teacher forcing under its loss mask."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import init_params, preset, token_logprobs
from jaxagent.models.generate import SamplingParams, generate_from_prompts, init_cache, jit_extend, jit_generate
from jaxagent.text import ChatRenderer, load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object",
                                                          "properties": {"word": {"type": "string"}},
                                                          "required": ["word"]}}}]


def test_two_turns_with_cache_reuse_match_scratch_and_teacher_forcing(fixtures_dir):
    tok = load_tokenizer(fixtures_dir / "tokenizer_qwen")
    cfg = preset("tiny-qwen2", vocab_size=tok.vocab_size, max_position_embeddings=1024)
    params = jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, init_params(jax.random.key(0), cfg))
    stops = jnp.asarray([list(tok.eos_token_ids)], jnp.int32)
    N = 12
    extend, generate = jit_extend(cfg), jit_generate(cfg, N, None, tok.pad_token_id)
    key = jax.random.split(jax.random.key(1), 1)

    chat = ChatRenderer(tok, tools=TOOLS)
    chat.add({"role": "system", "content": "You answer briefly."},
             {"role": "user", "content": "What does apple mean?"})
    prompt1 = chat.start_generation()
    cache = init_cache(cfg, 1, 512)
    logits, cache = extend(params, cache, jnp.asarray([prompt1]), jnp.asarray([len(prompt1)]))
    out1 = generate(params, cache, logits, key, temperature_B=0.0, stop_tokens_BS=stops)
    n1 = int(out1.num_tokens[0])
    gen1 = np.asarray(out1.tokens[0, :n1]).tolist()
    chat.append_generated(gen1)
    chat.add({"role": "tool", "content": "apple: a fruit"})
    prompt2 = chat.start_generation()
    # Token-in/token-out: the second prompt extends the first prompt plus the generated tokens.
    assert prompt2[: len(prompt1) + n1] == prompt1 + gen1
    cached = int(out1.cache.lengths[0])
    assert cached == len(prompt1) + n1 - 1  # all but the last generated token
    new = prompt2[cached:]
    logits2, cache2 = extend(params, out1.cache, jnp.asarray([new]), jnp.asarray([len(new)]))
    out2 = generate(params, cache2, logits2, key, temperature_B=0.0, stop_tokens_BS=stops)
    n2 = int(out2.num_tokens[0])
    gen2 = np.asarray(out2.tokens[0, :n2]).tolist()

    # The same second turn generated from scratch on the whole prompt.
    scratch, _ = generate_from_prompts(params, [prompt2], config=cfg, key=jax.random.key(1),
                                       sampling=SamplingParams(0.0, max_new_tokens=N,
                                                               stop_tokens=tuple(tok.eos_token_ids)),
                                       pad_id=tok.pad_token_id)
    assert np.asarray(scratch.tokens[0, :n2]).tolist() == gen2
    np.testing.assert_allclose(scratch.logp_policy[0, :n2], out2.logp_policy[0, :n2], atol=1e-5)

    chat.append_generated(gen2)
    record = chat.finish()
    mask = record.loss_mask()
    assert int(mask.sum()) == n1 + n2  # exactly the generated tokens (stop tokens included) are trained
    lp = np.asarray(token_logprobs(params, jnp.asarray([record.tokens]), config=cfg))[0]
    # token_logprobs[t] scores token t+1: the log-prob of each masked token sits one to its left.
    scored = lp[:-1][mask[1:].astype(bool)]
    generated_lp = np.concatenate([np.asarray(out1.logp_policy[0, :n1]), np.asarray(out2.logp_policy[0, :n2])])
    np.testing.assert_allclose(scored, generated_lp, atol=1e-5)
