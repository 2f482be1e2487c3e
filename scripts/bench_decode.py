#!/usr/bin/env python3
"""Decode throughput of the KV-cache generator: decode steps/s and new tokens/s.

A batch of random prompts of ``--context`` tokens is prefilled into a fresh cache (timed as
``prefill_s``), then ``--new-tokens`` tokens are decoded per row in one jitted while-loop
(`jaxagent.models.generate.jit_generate`, greedy unless ``--temperature`` > 0; no stop tokens,
so every row decodes all of them). decode steps/s = new_tokens / decode seconds; new tokens/s =
batch * that. On a CPU backend the same decode in transformers ``generate`` (greedy, same
weights, same prompts, ``min_new_tokens = max_new_tokens``) is timed as the baseline, end to end
against our prefill + decode, and the greedy tokens of both are compared.

``--peer tunix`` instead times Google's tunix (``pip install google-tunix``, an optional extra;
without it the script says so and times ours alone): its Qwen2 (`tunix.models.qwen2`) with our
weights converted, prefilled and decoded by its `Sampler`'s own jitted prefill and while-loop
decode (greedy, same prompts, same shapes, same dtype, one cache of context + new tokens), in
this process, alternating with ours repeat by repeat. ``decode_speedup_vs_tunix`` = ours / tunix
decode steps/s (decode only: each side's prefill is outside the timed region); the greedy tokens
of both are compared. Only Qwen2-family shapes (q/k/v biases, no q/k norm) have a tunix peer here.

    python3 scripts/bench_decode.py                                   # tiny-qwen2, CPU, vs transformers
    taskset -c 1 python3 scripts/bench_decode.py --peer tunix --shape small-qwen2 --iters 9  # vs tunix
    python3 scripts/bench_decode.py --shape qwen2.5-1.5b --batch 64 --context 512 --new-tokens 256  # GPU bar

The last line of stdout is one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

try:
    import jaxagent  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import DTypePolicy, init_params, preset, preset_names, save_pretrained
from jaxagent.models.generate import init_cache, jit_extend, jit_generate


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="tiny-qwen2", choices=preset_names())
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=128, help="prompt tokens per row")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="default: float32 on CPU, bfloat16 elsewhere")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--scan-unroll", type=int, default=1, help="layers unrolled per scan step in decode")
    p.add_argument("--iters", type=int, default=3, help="timed decode runs (median reported)")
    p.add_argument("--no-torch", action="store_true", help="skip the transformers baseline")
    p.add_argument("--peer", choices=("transformers", "tunix"), default="transformers",
                   help="baseline: transformers generate (CPU only) or tunix's Qwen2 sampler decode (optional extra)")
    args = p.parse_args(argv)
    for name in ("batch", "context", "new_tokens", "iters", "scan_unroll"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive integer")
    return args


def torch_baseline(cfg, params, prompts: np.ndarray, new_tokens: int, iters: int) -> dict:
    import torch
    import transformers

    with tempfile.TemporaryDirectory(prefix="bench_decode_") as tmp:
        save_pretrained(Path(tmp) / "m", cfg, params, dtype="float32")
        model = transformers.AutoModelForCausalLM.from_pretrained(Path(tmp) / "m", dtype=torch.float32).eval()
    ids = torch.from_numpy(prompts.astype(np.int64))
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                  pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(ids))
    times = []
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)  # warm-up
        for _ in range(iters):
            t0 = time.perf_counter()
            out = model.generate(ids, **kwargs)
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"decode_s": med, "tokens": out[:, prompts.shape[1]:].numpy(), "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}


# ---------------------------------------------------------------------------- tunix peer
def import_tunix():
    """tunix's Qwen2 model and sampler modules. Only those submodules are imported: the package's
    ``__init__`` pulls in its trainers (and their dependencies), which decoding does not need."""
    spec = importlib.util.find_spec("tunix")
    if spec is None:
        raise ImportError("tunix is not installed (pip install google-tunix)")
    if "tunix" not in sys.modules:
        pkg = types.ModuleType("tunix")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["tunix"] = pkg
    from tunix.generate import sampler as sampler_lib
    from tunix.models.qwen2 import model as model_lib

    try:
        from importlib.metadata import version
        tunix_version = version("google-tunix")
    except Exception:  # noqa: BLE001
        tunix_version = "unknown"
    return model_lib, sampler_lib, tunix_version


class _NoTokenizer:
    """The sampler wants a tokenizer for pad / eos ids only; -1 is never a token, so no prompt
    token is padding and no generated token ends a row (every row decodes all new tokens)."""

    def encode(self, text):
        return []

    def decode(self, ids):
        return ""

    def bos_id(self):
        return None

    def eos_id(self):
        return -1

    def pad_id(self):
        return -1


class TunixPeer:
    """tunix's Qwen2 with our weights and its `Sampler`'s jitted prefill / decode loop."""

    def __init__(self, cfg, params, batch: int, capacity: int):
        from flax import nnx

        model_lib, sampler_lib, self.version = import_tunix()
        self.sampler_lib = sampler_lib
        if cfg.family != "qwen2" or not cfg.qkv_bias or cfg.qk_norm or cfg.o_bias or cfg.rope_scaling.rope_type != "default":
            raise ValueError(f"no tunix peer for this shape (tunix's Qwen2: q/k/v biases, no q/k norm, no o bias, "
                             f"plain RoPE; got family={cfg.family})")
        dt = jnp.dtype(cfg.dtype.compute)
        mc = model_lib.ModelConfig(
            num_layers=cfg.num_hidden_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
            hidden_dim=cfg.intermediate_size, num_heads=cfg.num_attention_heads, head_dim=cfg.head_dim,
            num_kv_heads=cfg.num_key_value_heads, rope_theta=cfg.rope_theta, norm_eps=cfg.rms_norm_eps,
            use_tied_embedding=cfg.tie_word_embeddings, dtype=dt, param_dtype=dt,
        )
        m = model_lib.Qwen2(mc, rngs=nnx.Rngs(0))
        L = params["layers"]

        def put(var, x):
            var[...] = jnp.asarray(x, dt).reshape(var.shape)

        put(m.embedder.input_embedding, params["embed"])
        put(m.final_norm.w, params["final_norm"])
        if not cfg.tie_word_embeddings:
            put(m.lm_head.w, params["lm_head"])
        for i, layer in enumerate(m.layers):
            a = layer.attn
            for var, name in ((a.q_proj.w, "q"), (a.k_proj.w, "k"), (a.v_proj.w, "v"), (a.o_proj.w, "o"),
                              (a.q_bias, "q_bias"), (a.k_bias, "k_bias"), (a.v_bias, "v_bias"),
                              (layer.input_layernorm.w, "attn_norm"), (layer.post_attention_layernorm.w, "mlp_norm"),
                              (layer.mlp.gate_proj.kernel, "gate"), (layer.mlp.up_proj.kernel, "up"),
                              (layer.mlp.down_proj.kernel, "down")):
                put(var, L[name][i])
        cache = sampler_lib.CacheConfig(cache_size=capacity, num_layers=cfg.num_hidden_layers,
                                        num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
        self.sampler = sampler_lib.Sampler(m, _NoTokenizer(), cache)
        self.sampler.eos_ids = jnp.asarray([-1], jnp.int32)  # set by Sampler.__call__, which we bypass

    def prefill(self, prompts, new_tokens: int):
        s = self.sampler
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # its model has no init_cache of its own
            state = s.init_sample_state(
                jnp.asarray(prompts), total_sampling_steps=prompts.shape[1] + new_tokens, include_logits=False,
                forbidden_token_ids=None, temperature=0.0, top_p=None, top_k=None, seed=jax.random.PRNGKey(0),
                beam_size=None,
            )
        return jax.block_until_ready(s._compiled_prefill_fn(s._flattened_transformer_state, state, None, echo=False))

    def decode(self, state):
        s = self.sampler
        return jax.block_until_ready(s._compiled_decode_fn(s._flattened_transformer_state, state))

    @staticmethod
    def tokens(state, prompt_len: int, new_tokens: int) -> np.ndarray:
        """The greedy tokens after the prompt: the first drawn by the prefill, the rest by the loop."""
        return np.asarray(state.token_buffer[:, prompt_len:prompt_len + new_tokens])


def main(argv=None) -> dict:
    args = parse_args(argv)
    backend = jax.default_backend()
    dtype = args.dtype or ("float32" if backend == "cpu" else "bfloat16")
    cfg = preset(args.shape, dtype=DTypePolicy(dtype, dtype))
    B, P, N = args.batch, args.context, args.new_tokens
    if P + N > cfg.max_position_embeddings:
        raise SystemExit(f"--context + --new-tokens = {P + N}: exceeds max_position_embeddings={cfg.max_position_embeddings}")
    log(f"[jax] {args.shape} ({cfg.num_params() / 1e6:.1f}M) batch={B} context={P} new={N} dtype={dtype} "
        f"on {backend}:{jax.devices()[0].device_kind}; {args.iters} timed iterations after a compiling one")
    key_p, key_t, key_s = jax.random.split(jax.random.key(0), 3)
    params = jax.jit(init_params, static_argnums=1)(key_p, cfg)
    prompts = jax.random.randint(key_t, (B, P), 0, cfg.vocab_size, dtype=jnp.int32)
    n_new = jnp.full((B,), P, jnp.int32)
    keys = jax.random.split(key_s, B)
    capacity = P + N

    extend = jit_extend(cfg, None, args.scan_unroll)
    gen = jit_generate(cfg, N, None, 0, args.scan_unroll)

    def prefill():
        logits, cache = extend(params, init_cache(cfg, B, capacity), prompts, n_new)
        return jax.block_until_ready((logits, cache))

    def decode(logits, cache):
        out = gen(params, cache, logits, keys, temperature_B=args.temperature)
        return jax.block_until_ready(out)

    peer, peer_skipped = None, None
    if args.peer == "tunix":
        try:
            peer = TunixPeer(cfg, params, B, capacity)
        except (ImportError, ValueError) as e:
            peer_skipped = f"{type(e).__name__}: {e}"
            log(f"[tunix] skipped ({peer_skipped}); timing ours alone")

    log("[jax] compiling prefill + decode (the first call)")
    t0 = time.perf_counter()
    logits, cache = prefill()
    out = decode(logits, cache)
    compile_s = time.perf_counter() - t0
    log(f"[jax] first call {compile_s:.1f}s; timing")
    if peer is not None:
        t0 = time.perf_counter()
        peer_out = peer.decode(peer.prefill(np.asarray(prompts), N))
        peer_compile_s = time.perf_counter() - t0
    pre, dec, peer_dec = [], [], []
    for _ in range(args.iters):  # alternating: ours, then the peer, every repeat
        t0 = time.perf_counter()
        logits, cache = prefill()
        t1 = time.perf_counter()
        out = decode(logits, cache)
        t2 = time.perf_counter()
        pre.append(t1 - t0)
        dec.append(t2 - t1)
        if peer is not None:
            state = peer.prefill(np.asarray(prompts), N)
            t0 = time.perf_counter()
            peer_out = peer.decode(state)
            peer_dec.append(time.perf_counter() - t0)
    assert int(out.num_tokens.min()) == N, "every row must decode all new tokens"
    decode_s = statistics.median(dec)
    result = {
        "bench": "decode",
        "decode_steps_per_s": N / decode_s,
        "new_tokens_per_s": B * N / decode_s,
        "batch": B,
        "context": P,
        "new_tokens": N,
        "device": f"{backend}:{jax.devices()[0].device_kind}",
        "shape": args.shape,
        "dtype": dtype,
        "temperature": args.temperature,
        "scan_unroll": args.scan_unroll,
        "decode_s": decode_s,
        "prefill_s": statistics.median(pre),
        "prefill_tokens_per_s": B * P / statistics.median(pre),
        "compile_s": compile_s,
        "iters": args.iters,
        "jax_version": jax.__version__,
    }
    log(f"[jax] decode {decode_s:.3f}s -> {result['decode_steps_per_s']:.1f} steps/s, "
        f"{result['new_tokens_per_s']:,.0f} new tokens/s; prefill {result['prefill_s']:.3f}s")
    if args.peer == "tunix":
        if peer is None:
            result["tunix_skipped"] = peer_skipped
        else:
            peer_s = statistics.median(peer_dec)
            peer_tokens = peer.tokens(peer_out, P, N)
            result.update(
                tunix_decode_steps_per_s=N / peer_s,
                tunix_decode_s=peer_s,
                decode_speedup_vs_tunix=peer_s / decode_s,
                greedy_tokens_match_tunix=bool(
                    args.temperature == 0 and (peer_tokens == np.asarray(out.tokens)).all()
                ),
                tunix_compile_s=peer_compile_s,
                tunix_version=peer.version,
            )
            log(f"[tunix] decode {peer_s:.3f}s -> {N / peer_s:.1f} steps/s; ours/tunix "
                f"{result['decode_speedup_vs_tunix']:.2f}, greedy tokens match: {result['greedy_tokens_match_tunix']}")
    elif backend == "cpu" and not args.no_torch:
        try:
            base = torch_baseline(cfg, params, np.asarray(prompts), N, args.iters)
        except ImportError as e:
            result["transformers_skipped"] = str(e)
        else:
            result.update(
                transformers_decode_steps_per_s=N / base["decode_s"],
                # transformers' generate includes its prefill: compare end to end.
                speedup_vs_transformers_cpu=base["decode_s"] / (decode_s + statistics.median(pre)),
                greedy_tokens_match_transformers=bool(
                    args.temperature == 0 and (base["tokens"] == np.asarray(out.tokens)).all()
                ),
                torch_version=base["torch_version"],
                transformers_version=base["transformers_version"],
            )
            log(f"[torch] generate {base['decode_s']:.3f}s -> {N / base['decode_s']:.1f} steps/s "
                f"(incl. its prefill); ratio {result['speedup_vs_transformers_cpu']:.2f}")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    t_start = time.perf_counter()
    main()
    sys.stdout.flush()
    print(f"bench_decode: done in {time.perf_counter() - t_start:.0f} s; results above (JSON on stdout); record them in "
          "docs/BENCHMARKS.md", file=sys.stderr, flush=True)
