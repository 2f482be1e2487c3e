"""``python -m jaxagent.tour``: a tour of the model stack on whatever devices JAX sees: build (or load) a Qwen-architecture model sharded over a device mesh, write it as
a Hugging Face checkpoint and read it back (checking the round trip is exact), score a batch with
teacher-forced log-probs, and continue prompts greedily with the KV-cache generator (checking the
tokens and log-probs against teacher forcing), printing what it did and how fast.

    python -m jaxagent.tour                       # tiny random Qwen2 on this machine
    python -m jaxagent.tour --model tiny-qwen3    # any preset name (random weights)
    python -m jaxagent.tour --model runs/quickstart/hf   # a local HF checkpoint dir (its weights)
    python -m jaxagent.tour --model qwen2.5-7b --dry-run   # shapes and parameter count only
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import (
    DTypePolicy,
    LogicalRules,
    MeshConfig,
    forward,
    load_pretrained,
    make_mesh,
    param_shardings,
    preset,
    preset_names,
    save_pretrained,
    token_logprobs,
)
from jaxagent.models.generate import SamplingParams, generate_from_prompts
from jaxagent.models.qwen import init_params
from jaxagent.models.sharding import batch_sharding
from jaxagent.models.placement import init_params_sharded


def _parse_mesh(text: str) -> MeshConfig:
    parts = text.split(",")
    if len(parts) != 3:
        raise SystemExit(f"--mesh={text!r}: expected three integers 'data,fsdp,tensor' (-1 = the rest)")
    try:
        data, fsdp, tensor = (int(p) for p in parts)
    except ValueError:
        raise SystemExit(f"--mesh={text!r}: expected three integers 'data,fsdp,tensor'") from None
    return MeshConfig(data=data, fsdp=fsdp, tensor=tensor)


def demo(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    mesh = make_mesh(args.mesh)
    rules = LogicalRules(mesh)
    devices = f"{len(jax.devices())} x {jax.devices()[0].device_kind} ({jax.default_backend()})"
    model_path = Path(args.model)
    trained = model_path.is_dir()    # a checkpoint's weights; else a preset's random initial weights
    if trained:
        config, params = load_pretrained(model_path, rules=rules)
        source = f"loaded HF checkpoint {model_path}"
    else:
        config = preset(args.model, dtype=DTypePolicy(args.dtype, args.dtype))
        source = f"random init of preset {args.model!r}"
        if args.dry_run:
            params = None
        else:
            params = init_params_sharded(jax.random.key(args.seed), config, rules)
    shapes = jax.eval_shape(functools.partial(init_params, config=config), jax.random.key(0))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
    print(f"[model] {config.architecture} ({source}): {n_params / 1e6:.2f}M parameters, "
          f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads / "
          f"{config.num_key_value_heads} KV heads, vocab {config.vocab_size}, dtype {config.dtype.param_dtype}")
    print(f"[mesh]  {dict(mesh.shape)} over {devices}")
    report = {"model": args.model, "weights": "checkpoint" if trained else "random",
              "architecture": config.architecture, "params": n_params, "mesh": dict(mesh.shape), "devices": devices}
    if args.dry_run:
        q = param_shardings(config, rules)["layers"]["q"]
        print(f"[dry-run] layers/q sharded as {q.spec}; nothing was allocated")
        return report

    out = Path(args.out)
    ckpt = out / "model"
    t0 = time.perf_counter()
    save_pretrained(ckpt, config, params)
    config2, params2 = load_pretrained(ckpt, rules=rules, dtype=config.dtype)
    exact = config2 == config and all(
        bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2))
    )
    size = sum(f.stat().st_size for f in ckpt.iterdir())
    print(f"[hf]    wrote {ckpt} ({size / 1e6:.1f} MB, loads with transformers.AutoModelForCausalLM); "
          f"read back: {'exact' if exact else 'MISMATCH'} ({time.perf_counter() - t0:.2f}s)")
    if not exact:
        raise SystemExit("round trip through the HF checkpoint was not exact")
    report["hf_round_trip_exact"] = exact

    rng = np.random.default_rng(args.seed)
    batch, seq = args.batch, min(args.seq, config.max_position_embeddings)
    tokens = jax.device_put(jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq)), jnp.int32),
                            batch_sharding(rules, shape=(batch, seq)))
    score = jax.jit(lambda p, t: token_logprobs(p, t, config=config, rules=rules))
    t0 = time.perf_counter()
    lp = score(params, tokens).block_until_ready()
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        score(params, tokens).block_until_ready()
        times.append(time.perf_counter() - t0)
    tok_s = batch * seq / float(np.median(times))
    mean_lp = float(jnp.mean(lp[:, :-1]))
    print(f"[score] teacher-forced log-probs of {batch}x{seq} random tokens: mean {mean_lp:.3f} nats "
          f"(uniform would be {-np.log(config.vocab_size):.3f}); {tok_s:,.0f} tokens/s after a "
          f"{compile_s:.1f}s compile")
    report.update(mean_logprob=mean_lp, teacher_forced_tokens_per_s=tok_s)

    prompts = np.asarray(tokens[:, : args.prompt_len]).tolist()
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    t0 = time.perf_counter()
    gen_out, _ = generate_from_prompts(params, prompts, config=config, sampling=sampling,
                                       key=jax.random.key(args.seed), rules=rules)
    new = np.asarray(gen_out.tokens)
    gen_s = time.perf_counter() - t0
    # Greedy tokens must be the argmax of a teacher-forced re-run over the result, and the
    # log-probs the generator returned must be the teacher-forced ones.
    seqs = jnp.asarray(np.concatenate([np.asarray(prompts), new], axis=1))
    argmax = np.asarray(jnp.argmax(forward(params, seqs, config=config)[:, args.prompt_len - 1 : -1], axis=-1))
    tf_lp = np.asarray(token_logprobs(params, seqs, config=config)[:, args.prompt_len - 1 : -1])
    consistent = bool((argmax == new).all())
    lp_err = float(np.abs(tf_lp - np.asarray(gen_out.logp_policy)).max())
    print(f"[greedy] KV-cache generation: {args.new_tokens} new tokens for {len(prompts)} prompts in {gen_s:.1f}s "
          f"(incl. compile); row 0: {prompts[0]} -> {new[0].tolist()}")
    print(f"[greedy] every new token is the argmax of a teacher-forced re-run: {consistent}; "
          f"max |generated - teacher-forced log-prob| = {lp_err:.1e}")
    report.update(greedy_consistent=consistent, logprob_max_abs_err=lp_err, continuation_row0=new[0].tolist())
    if not consistent:
        raise SystemExit("greedy continuation disagrees with the teacher-forced argmax")
    report["wall_s"] = time.perf_counter() - t_start
    (out / "demo.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"[done]  {report['wall_s']:.1f}s; report in {out / 'demo.json'}. {weights_note(trained, args.model)}")
    return report


def weights_note(trained: bool, model: str) -> str:
    """What the tour's numbers mean for these weights: a checkpoint's, or a preset's random init."""
    if trained:
        return (f"These are the weights of the checkpoint {model}; the prompts are random token ids, so "
                "the continuations show the generator at work, not what the model says to a real prompt.")
    return (f"This is a random model (preset {model!r}, random initial weights): its tokens are meaningless. "
            "Train one with python -m jaxagent.launch and pass its runs/<name>/hf directory as --model.")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m jaxagent.tour", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny-qwen2",
                    help=f"a preset ({', '.join(preset_names())}) or a local HF checkpoint directory")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="parameter and compute dtype for presets")
    ap.add_argument("--mesh", type=_parse_mesh, default=MeshConfig(), help="data,fsdp,tensor (default 1,-1,1)")
    ap.add_argument("--out", default="runs/demo", help="output directory")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="shapes, mesh and parameter count only")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("batch", "seq", "prompt_len", "new_tokens"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)}: expected a positive integer")
    if args.prompt_len > args.seq:
        raise SystemExit(f"--prompt-len={args.prompt_len}: expected at most --seq={args.seq}")
    demo(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
