"""SFT probe: trains the run config's SFT phase alone and splits the held-out demonstration loss
by token kind (the intention gym's detail *values*, detail names, everything else), then evaluates
greedily on 32 test tasks and prints a failed episode's agent turns.

    python3 scripts/probe_sft.py sft.steps=500 [key=value ...]   # any launch override

Progress (every 50 steps) goes to stderr; the last stdout line is JSON. Used for the quickstart
section of docs/BENCHMARKS.md.
"""
import sys, time, json
import numpy as np, jax, jax.numpy as jnp
from jaxagent.config import load_config
from jaxagent.train import jobs
from jaxagent.train.step import learning_rate, make_optimizer, make_update, sft_loss_fn, TrainState, sequence_scores
from jaxagent.train.evaluate import evaluate
from jaxagent.models import LogicalRules, make_mesh
from jaxagent.rollout.engine import GenerationEngine
from jaxagent.envs.gyms.demos import expert_demos, render_demo
from jaxagent.envs.gyms.intention import DOMAINS

args = sys.argv[1:]
every = 50
cfg = load_config(None, args)
rules = LogicalRules(make_mesh(cfg.mesh))
tok = jobs.build_tokenizer(cfg)
qcfg, params = jobs.build_model(cfg, tok, rules)
print("params", jobs.param_count(params), file=sys.stderr)
t0 = time.perf_counter()
data = jobs.sft_data(cfg, tok)
held = [render_demo(d, tok, tool_schemas_in_prompt=cfg.rollout.tool_schemas_in_prompt)
        for d in expert_demos(cfg.env.gym, "test", 48, seed=cfg.env.task_seed, noise=0.0, policy=cfg.sft.demo_policy)]
values = {v for d in DOMAINS.values() for vs in d.values() for v in vs}
slots = {s for d in DOMAINS.values() for s in d}
def cat(t):
    w = tok.decode([t]).strip()
    return "value" if w in values else "slot" if w in slots else "other"
hb = jobs.sft_batch(held, np.arange(len(held)))
cats = np.vectorize(lambda t: {"value": 0, "slot": 1, "other": 2}[cat(t)])(hb["tokens"])
score = jax.jit(lambda p, t: sequence_scores(p, t, config=qcfg))
def heldout(p):
    lp = np.asarray(score(p, jnp.asarray(hb["tokens"])))  # next-token logp [B, L]
    # lp[:, i] = log p(token i+1 | <= i)?  check: align by loss mask of token positions
    m = hb["loss_mask"]
    out = {}
    tgt_lp = lp
    for name, c in (("value", 0), ("slot", 1), ("other", 2)):
        mm = (m > 0) & (cats == c)
        out[name] = float(-(tgt_lp * mm).sum() / max(mm.sum(), 1))
    return out
s = cfg.sft
optim = jobs.sft_optim(cfg)
tx = make_optimizer(optim)
update = make_update(sft_loss_fn(qcfg), tx, lr_schedule=learning_rate(optim))
state = TrainState.create(params, tx)
for i in range(s.steps):
    idx = jobs.step_rng(cfg.seed, "sft", i).choice(len(data), size=s.batch_size, replace=False)
    state, m = update(state, {k: jnp.asarray(v) for k, v in jobs.sft_batch(data, idx).items()})
    if (i + 1) % every == 0:
        print(f"step {i+1} t={time.perf_counter()-t0:.0f}s loss={float(m['loss']):.4f} held={heldout(state.params)}", file=sys.stderr, flush=True)
t_sft = time.perf_counter() - t0
make_env, train, test = jobs.build_env(cfg)
eng = GenerationEngine(state.params, qcfg, slots=16, capacity=1024, vocab_limit=tok.vocab_size)
mm, trajs = evaluate(state.params, eng, make_env, tok, test[:32], k=1, sampling=jobs.sampling_params(cfg, tok, temperature=0.0),
                     key=jax.random.key(0), episode=jobs.episode_config(cfg))
print(json.dumps({"args": args, "heldout_loss": heldout(state.params), "sft_s": round(t_sft), "success": mm["success"], "reward": mm["reward"], "turns": mm["turns"]}))
for t in [t for t in trajs if t.outcome_reward < 1][:2]:
    print(f"---- reward {t.outcome_reward:.3f} ({t.termination})", file=sys.stderr)
    for line in tok.decode(t.tokens).splitlines():
        if line.startswith('{"name"'):
            print(line, file=sys.stderr)
