"""The programs `--plan` compiles (`jaxagent.jobs.memplan`): each jitted program a job runs, lowered
with abstract shapes on the configured mesh: the update (RL's PPO loss, job=sft's SFT loss,
job=dpo's pair loss), the teacher-forced scorer, InfoPO's info-gain program, and the engine's
prefill and decode."""

from __future__ import annotations


def match_shardings(opt_abs, trained, t_shard):
    """Shardings for the array leaves (ndim >= 1) of an optax state: each moment tree mirrors the
    trained parameters, so the leaves come in the parameters' order, repeated."""
    import jax

    ps = jax.tree.leaves(t_shard)
    shapes = [x.shape for x in jax.tree.leaves(trained)]
    out, i = [], 0
    for x in jax.tree.leaves(opt_abs):
        if not x.ndim:
            continue
        j = i % len(ps)
        assert x.shape == shapes[j], (x.shape, shapes[j])
        out.append(ps[j])
        i += 1
    return out


def infogain_shapes(cfg, L: int) -> dict[str, int]:
    """The shapes InfoPO's info-gain program (`jaxagent.train.infogain.compute_infogain`) is planned
    at: the iteration's episodes B = ``rl.group_size`` x ``rl.tasks_per_step`` at length ``L``, its
    turns T = ``rollout.max_turns`` (the trainer pads the turns to it) and the shared-prefix pass's
    packed length at its worst: each row's trajectory plus the counterfactual suffixes of all its
    turns. Turn t's suffix is the replacement of o_t and the tokens from o_t's end through a_{t+1}'s;
    those stretches of one row do not overlap, so together they hold at most L tokens, and

        packed_len <= 2 L + T x P   (placeholder_mode="replace": P placeholder tokens per turn)
        packed_len <= 2 L           ("overwrite": the placeholder takes o_t's own length)

    rounded up to ``rl.length_multiple`` as the trainer rounds it. P is bounded by the placeholder's
    UTF-8 bytes (a byte-level BPE token holds at least one byte; no tokenizer is loaded to plan)."""
    B = cfg.rl.group_size * cfg.rl.tasks_per_step
    T = cfg.rollout.max_turns
    P = len(cfg.infopo.placeholder.encode("utf-8"))
    need = 2 * L + (T * P if cfg.infopo.placeholder_mode == "replace" else 0)
    m = cfg.rl.length_multiple
    return {"rows": B, "length": L, "turns": T, "placeholder_tokens": P, "packed_len": -(-need // m) * m}


def row_split_notes(cfg, rules, *, rows: int, micro: int, info: bool) -> list[str]:
    """What the plan says of an RL job's programs whose rows at a time do not split evenly over the
    mesh's batch devices (`jaxagent.models.sharding.row_rules`): those run every row on every
    device, and a multiple of the device count would split them."""
    from jaxagent.models.sharding import batch_devices, row_rules

    n = batch_devices(rules)
    if cfg.job not in ("rl", "sft+rl") or n == 1:
        return []
    if cfg.mesh.distributed:
        return ["mesh.distributed=true: the RL trainer keeps every row of its scorer, info gain and update on "
                "every device (its host reads the credit), as planned"]
    out = []
    if row_rules(rules, rows // micro) is None:
        k = rows // micro
        out.append(f"the update's rows per microbatch ({k}) do not split over the {n} batch devices "
                   f"(data x fsdp): each device runs all of them; rl.minibatch_size / rl.microbatches a "
                   f"multiple of {n} splits them")
    B = cfg.rl.group_size * cfg.rl.tasks_per_step
    chunk = cfg.rl.rows_scored_at_a_time(B)
    if row_rules(rules, chunk) is None:
        out.append(f"rl.score_rows={cfg.rl.score_rows}: {chunk} rows at a time do not split over the {n} batch "
                   f"devices: the scorer{' and the info gain' if info else ''} run them on every device; "
                   f"a multiple of {n} splits them")
    return out


def compile_program(name, cfg, qcfg, rules, p_abs, *, rows, L, park, micro, trained):
    """Program ``name`` (update, scorer, infogain, prefill, decode) of ``cfg``'s job lowered with abstract
    parameters ``p_abs`` on ``rules``' mesh and compiled (`jax.stages.Compiled`)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxagent.models.sharding import batch_sharding, row_rules

    mesh = rules.mesh
    rep = NamedSharding(mesh, PartitionSpec())
    rl_rules = None if cfg.mesh.distributed else rules  # `RLTrainer.rules`: none across processes
    sds = lambda shape, dt, s=rep: jax.ShapeDtypeStruct(shape, dt, sharding=s)
    if name == "update":
        from jaxagent.credit.losses import PPOConfig  # noqa: F401
        from jaxagent.train.step import StepShardings, TrainState, make_optimizer, make_update, ppo_loss_fn, sft_loss_fn

        tx = make_optimizer(cfg.optim)
        trainable = ("lora",) if qcfg.lora is not None else None
        st = jax.eval_shape(lambda p: TrainState.create(p, tx, trainable=trainable), p_abs)
        # where the trainer's state lives: `tx.init` on the placed parameters gives moments laid out
        # like them (eager zeros_like keeps the sharding); counters replicated (`place_on_mesh`)
        sh = lambda t: jax.tree.map(lambda x: x.sharding, t)
        t_abs = {"lora": p_abs["lora"]} if trainable else p_abs
        t_shard = sh(t_abs)
        moments = iter(match_shardings(st.opt_state, t_abs, t_shard))
        opt_shard = jax.tree.map(lambda x: next(moments) if x.ndim else rep, st.opt_state)
        st_shard = TrainState(t_shard, opt_shard, rep, rep,
                              None if st.frozen is None else sh({k: v for k, v in p_abs.items() if k != "lora"}))
        st_abs = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), st, st_shard)
        bs = batch_sharding(rules, shape=(rows, 1))
        agg = "token_mean"
        if cfg.job == "sft":
            loss = sft_loss_fn(qcfg)
            batch = {"tokens": sds((rows, L), jnp.int32, bs), "loss_mask": sds((rows, L), jnp.float32, bs)}
        elif cfg.job == "dpo":  # `jaxagent.train.dpo.train_dpo`'s update: chosen and rejected rows of one length
            from jaxagent.train.dpo import DPO_AGG, dpo_loss_fn

            d = cfg.dpo
            loss, agg = dpo_loss_fn(qcfg, d.beta, d.loss_type, d.label_smoothing), DPO_AGG
            batch = {f"{side}_{k}": sds((rows, L), dt, bs) for side in ("chosen", "rejected")
                     for k, dt in (("tokens", jnp.int32), ("mask", jnp.bool_))}
            batch.update({k: sds((rows, 1), jnp.float32, bs) for k in ("weight", "ref_chosen", "ref_rejected")})
        else:
            loss = ppo_loss_fn(qcfg, cfg.ppo, rules=row_rules(rl_rules, rows // micro))  # as `RLTrainer` builds it
            batch = {k: sds((rows, L), jnp.float32, bs) for k in ("loss_mask", "advantages", "old_logp")}
            batch["tokens"] = sds((rows, L), jnp.int32, bs)
            if cfg.ppo.kl_coef > 0:
                batch["ref_logp"] = sds((rows, L), jnp.float32, bs)
        upd = make_update(loss, tx, microbatches=micro, agg=agg, shardings=StepShardings(st_shard, bs))
        return upd.lower(st_abs, batch).compile()
    if name == "scorer":
        from jaxagent.train.step import sequence_scores

        # the trainer's scorer (`RLTrainer.scores`): rows over the batch axes, the rules when a chunk splits
        bs = batch_sharding(rules, shape=(rows, 1))
        chunk_rules = row_rules(rl_rules, cfg.rl.rows_scored_at_a_time(rows))
        fn = jax.jit(lambda p, t: sequence_scores(p, t, config=qcfg, row_chunk=cfg.rl.score_rows or None,
                                                  rules=chunk_rules))
        return fn.lower(p_abs, sds((rows, L), jnp.int32, bs)).compile()
    if name == "infogain":  # the trainer's call (`compute_infogain` with the run's rules): rows over the batch axes
        from jaxagent.credit.batch import CreditBatch
        from jaxagent.credit.infogain import shared_prefix_jit, vmapped_jit

        sh = infogain_shapes(cfg, L)
        B, T = sh["rows"], sh["turns"]
        i32, f32, b = jnp.int32, jnp.float32, jnp.bool_
        row = lambda shape, dt: sds(shape, dt, rep if rl_rules is None else batch_sharding(rules, shape=shape))
        batch = CreditBatch(
            tokens_BL=row((B, L), i32), pad_mask_BL=row((B, L), i32), loss_mask_BL=row((B, L), f32),
            turn_idx_BL=row((B, L), i32), action_span_BT2=row((B, T, 2), i32), feedback_span_BT2=row((B, T, 2), i32),
            turn_valid_BT=row((B, T), b), segment_idx_BL=row((B, L), i32), segment_polarity_BQ=row((B, T), f32),
            segment_valid_BQ=row((B, T), b), reward_B=row((B,), f32), group_id_B=row((B,), i32))
        ph = sds((sh["placeholder_tokens"],), i32)
        kw = {"config": qcfg, "placeholder_mode": cfg.infopo.placeholder_mode, "row_chunk": cfg.rl.score_rows or None,
              "rules": row_rules(rl_rules, cfg.rl.rows_scored_at_a_time(B))}
        if cfg.infopo.mode in ("vmapped", "naive"):  # naive: the same histories, one call each (memplan's note)
            return vmapped_jit.lower(p_abs, batch, ph, **kw).compile()
        return shared_prefix_jit.lower(p_abs, batch, ph, packed_len=sh["packed_len"], **kw).compile()
    from jaxagent.models.generate import KVCache
    from jaxagent.rollout import engine as eng

    S, C, V = cfg.rollout.slots, cfg.rollout.capacity, qcfg.vocab_size
    shape = (qcfg.num_hidden_layers, S, C, qcfg.num_key_value_heads, qcfg.head_dim)
    try:  # where the engine puts them (heads the devices do not divide: the plan notes it, planned replicated)
        kv = eng.engine_cache_sharding(p_abs, qcfg, cfg.rollout.cache_sharding) or rep
    except ValueError:
        kv = rep
    cache = KVCache(sds(shape, qcfg.dtype.compute, kv), sds(shape, qcfg.dtype.compute, kv), sds((S,), jnp.int32))
    logits = sds((S, V), jnp.float32)
    if name == "prefill":
        A, T = S, C
        i = lambda n: sds((n,), jnp.int32)
        return eng._prefill.lower(p_abs, cache, i(A), sds((A, T), jnp.int32), i(A), i(A), logits,
                                  config=qcfg, window=C).compile()
    if name == "decode":
        B = S
        i = lambda n: sds((n,), jnp.int32)
        f = lambda n: sds((n,), jnp.float32)
        # the engine unrolls the layers on a CPU backend only (split weights): plan the accelerators' layer scan
        real = jax.default_backend
        eng.jax.default_backend = lambda: "gpu"
        try:
            return eng._decode.lower(p_abs, cache, logits, i(B), sds((B, 2), jnp.uint32), i(B), i(B), f(B), i(B), f(B),
                                     sds((B, 4), jnp.int32), sds((B,), jnp.bool_), config=qcfg, vocab_limit=None,
                                     steps=cfg.rollout.decode_steps, window=C).compile()
        finally:
            eng.jax.default_backend = real
    raise ValueError(f"unknown program {name!r}")


__all__ = ["compile_program", "infogain_shapes", "match_shardings"]
