"""SFT probe: trains the run config's SFT phase alone and splits the held-out demonstration loss
by token kind (the intention gym's detail *values*, detail names, everything else), then evaluates
greedily on 32 test tasks and prints a failed episode's agent turns.

    python3 scripts/probe_sft.py sft.steps=500 [key=value ...]   # any launch override
    python3 scripts/probe_sft.py --note in-order sft.steps=500      # another running-note format

``--note`` swaps the intention gym's imitable demonstrator for one whose running note is written
differently (the comparison in docs/BENCHMARKS.md): ``newest-first`` (the gym's own, "the plan :
scarf green ."), ``in-order`` ("green scarf"), ``in-order-commas`` ("green , scarf"), or
``fixed-slots`` (one entry per detail in the system prompt's order, "-" where none is known).
``PROBE_SHOW=N`` prints N failed held-out episodes (default 2).

Progress (every 50 steps) goes to stderr; the last stdout line is JSON. Used for the quickstart
section of docs/BENCHMARKS.md.
"""
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

try:
    import jaxagent  # noqa: F401
except ImportError:  # run from a checkout without an install
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jaxagent.jobs.config import load_config
from jaxagent.envs.gyms.demos import expert_plan
from jaxagent.rollout.demos import play_demos, render_demo
from jaxagent.envs.gyms.intention import DOMAINS
from jaxagent.models import LogicalRules, make_mesh
from jaxagent.rollout.engine import GenerationEngine
from jaxagent import jobs
from jaxagent.eval.rollouts import evaluate
from jaxagent.train.step import TrainState, learning_rate, make_optimizer, make_update, sequence_scores, sft_loss_fn

args = sys.argv[1:]
if args[:1] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)
NOTES = ("newest-first", "in-order", "in-order-commas", "fixed-slots")
note = "newest-first"
if args[:1] == ["--note"]:
    note, args = args[1], args[2:]
    if note not in NOTES:
        sys.exit(f"--note {note!r}: expected one of {', '.join(NOTES)}")
if note != "newest-first":
    import dataclasses

    from jaxagent.envs import gyms
    from jaxagent.envs.gyms.common import act, answer

    def _demonstrator(env):
        t, st = env.task, env.state
        todo = [s for s in DOMAINS[t["domain"]] if s != t["stated"] and s not in st["asked"]]
        known = (t["stated"], *st["revealed"])
        if note == "fixed-slots":
            text = " ".join(t["values"][s] if s in known else "-" for s in DOMAINS[t["domain"]])
        else:
            text = (" , " if note == "in-order-commas" else " ").join(t["values"][s] for s in known)
        return act(f"the plan : {text} . what is the {todo[0]} ?") if todo else answer(f"the plan : {text} .")

    gyms.GYMS["intention"] = dataclasses.replace(gyms.GYMS["intention"], imitable_policy=_demonstrator)
every = 50
cfg = load_config(None, args)
rules = LogicalRules(make_mesh(cfg.mesh))
tok = jobs.build_tokenizer(cfg)
qcfg, params = jobs.build_model(cfg, tok, rules)
print("params", jobs.param_count(params), f"; SFT {cfg.sft.steps} steps (a line every 50), then 32 held-out "
      "episodes", file=sys.stderr, flush=True)
t0 = time.perf_counter()
data = jobs.sft_data(cfg, tok)
held = [render_demo(d, tok, tool_schemas_in_prompt=cfg.rollout.tool_schemas_in_prompt)
        for d in play_demos(expert_plan(cfg.env.gym, "test", 48, seed=cfg.env.task_seed, noise=0.0,
                                        policy=cfg.sft.demo_policy))]
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
print(json.dumps({"args": args, "note": note, "heldout_loss": heldout(state.params), "sft_s": round(t_sft), "success": mm["success"], "reward": mm["reward"], "turns": mm["turns"]}))
for t in [t for t in trajs if t.outcome_reward < 1][:int(os.environ.get("PROBE_SHOW", "2"))]:
    print(f"---- reward {t.outcome_reward:.3f} ({t.termination})", file=sys.stderr)
    lines = tok.decode(t.tokens).splitlines()
    for j, line in enumerate(lines):
        if line.startswith('{"name"'):
            print("  A", line.split('"content": ')[-1][:-2], file=sys.stderr)
        elif line.startswith("<|im_start|>user") and j + 1 < len(lines) and not lines[j + 1].startswith("<tool_response>"):
            print("  U", lines[j + 1], file=sys.stderr)
print("probe_sft: done; results: the JSON line on stdout (failed episodes above, on stderr)", file=sys.stderr, flush=True)
