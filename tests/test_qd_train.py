"""Q&D training on exported rows: the weighted completion-only SFT loss by hand, the rows'
tokens as the local questioner samples them, the epoch order, and ``job=sft`` on ``sft.data``
end to end (from ``job=qd_label``'s files to a loadable checkpoint)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.credit.losses import sft_loss
from jaxagent.jobs.offline import epoch_batch
from jaxagent.launch import main
from jaxagent.models import init_params, preset
from jaxagent.qd.agents import completion_ids, decision_prompt_ids
from jaxagent.qd.synthetic import write_suite
from jaxagent.text.chat import ChatRenderer
from jaxagent.text.tokenizer import load_tokenizer
from jaxagent.train.rows import RowTokens, row_batch, weighted_sft_loss_fn
from jaxagent.train.step import sequence_scores
from tests.conftest import FIXTURES

CFG = preset("tiny-qwen2", vocab_size=64)


def _rows():
    return [RowTokens([1, 2, 3], [4, 5], 1.0), RowTokens([1, 2], [6, 7, 8], 2.0), RowTokens([3], [9], 0.5)]


def test_row_batch_masks_the_completion_only():
    b = row_batch(_rows(), [0, 1, 2], multiple=8)
    assert b["tokens"].shape == (3, 8) and b["loss_mask"].shape == (3, 8)
    assert b["tokens"][1, :5].tolist() == [1, 2, 6, 7, 8]
    assert b["loss_mask"][0].tolist() == [False] * 3 + [True] * 2 + [False] * 3
    assert b["loss_mask"][2].tolist() == [False, True] + [False] * 6
    np.testing.assert_array_equal(b["weight"], np.repeat([[1.0], [2.0], [0.5]], 8, axis=1))


def test_the_weighted_loss_by_hand_and_equal_weights_are_sft_loss():
    params = init_params(jax.random.key(0), CFG)
    b = row_batch(_rows(), [0, 1, 2], multiple=8)
    loss, m = weighted_sft_loss_fn(CFG)(params, b)
    logp = np.asarray(sequence_scores(params, jnp.asarray(b["tokens"]), config=CFG))
    num = den = 0.0
    for i, w in enumerate([1.0, 2.0, 0.5]):
        sel = b["loss_mask"][i].astype(bool)
        num += w * float(-logp[i][sel].sum())
        den += w * int(sel.sum())
    assert float(loss) == pytest.approx(num / den, rel=1e-6) and float(m["num_tokens"]) == pytest.approx(den)
    ones = dict(b, weight=np.ones((3, 8), np.float32))
    l1, _ = weighted_sft_loss_fn(CFG)(params, ones)
    ref, _ = sft_loss(jnp.asarray(logp), b["loss_mask"], agg="token_mean")
    assert float(l1) == pytest.approx(float(ref), rel=1e-6)


def test_epoch_batches_pass_over_every_row_once_per_epoch():
    n, bs = 10, 4
    per_epoch = 3
    for epoch in range(2):
        seen = np.concatenate([epoch_batch(n, bs, epoch * per_epoch + j, 0, "sft") for j in range(per_epoch)])
        assert set(seen.tolist()) == set(range(n)) and len(seen) == 12  # the last batch filled from the start
    assert not np.array_equal(epoch_batch(n, bs, 0, 0, "sft"), epoch_batch(n, bs, 3, 0, "sft"))  # reshuffled
    np.testing.assert_array_equal(epoch_batch(n, bs, 4, 0, "sft"), epoch_batch(n, bs, 4, 0, "sft"))


def test_row_tokens_are_what_the_questioner_conditions_on_and_generates():
    tok = load_tokenizer(FIXTURES / "tokenizer_qwen")
    prompt = decision_prompt_ids(tok, "Task: who founded Quux?")
    chat = ChatRenderer(tok, thinking="disabled")
    chat.add({"role": "user", "content": "Task: who founded Quux?"})
    assert prompt == chat.start_generation()
    target = '{"action": "STOP"}'
    ids = completion_ids(tok, target)
    assert ids[-1] in chat.stop_token_ids and tok.decode(ids[:-1]) == target
    # appended as a generation, the completion closes the assistant turn the template's way
    span = chat.append_generated(ids)
    assert list(chat.finish().tokens[span.start:span.end][-len(ids):]) == ids
    full = chat.render_text([{"role": "user", "content": "Task: who founded Quux?"},
                             {"role": "assistant", "content": target}])
    assert full.startswith(tok.decode(prompt + ids))  # the template's own text of the turn, to its end token


def test_job_sft_on_qd_rows_end_to_end(tmp_path):
    suite = write_suite(tmp_path / "syn.json", 6, depth=2, breadth=1, pool=8, seed=3)
    lab = ["job=qd_label", "progress=false", f"runs_dir={tmp_path}", "name=lab", "qd.benchmark=synthetic",
           f"qd.file={suite}", "qd.tasks=4", "qd.seeds=1", "qd.forks=2", "qd.questioner=scripted"]
    assert main(lab) == 0
    data = tmp_path / "lab" / "decisions.jsonl"
    n_rows = len(data.read_text().splitlines())
    args = ["job=sft", "progress=false", f"runs_dir={tmp_path}", "name=warm", f"sft.data={data}",
            f"tokenizer={FIXTURES / 'tokenizer_qwen'}", "model.preset=tiny-qwen2", "sft.batch_size=4",
            "sft.microbatches=2", "sft.epochs=3", "sft.lr=3e-3", "sft.warmup_ratio=0.1", "sft.max_len=4096"]
    assert main(args) == 0
    s = json.loads((tmp_path / "warm" / "summary.json").read_text())
    assert s["rows"] == n_rows == s["rows_trained"] + s["rows_too_long"] and s["rows_too_long"] == 0
    assert s["steps"] == -(-3 * n_rows // 4) and s["exported"] == ["hf"]
    recs = [json.loads(x) for x in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if r.get("phase") == "sft" and "loss" in r]
    assert losses[-1] < 0.7 * losses[0]  # the rows are learnt
    assert (tmp_path / "warm" / "hf" / "config.json").exists() and (tmp_path / "warm" / "hf" / "tokenizer.json").exists()
    # too long: every row left out is a setting error, not an empty run
    with pytest.raises(SystemExit, match="sft.max_len=16"):
        main([*args[:3], "name=short", *args[4:-1], "sft.max_len=16"])


def test_rows_past_the_models_positions_are_refused_before_training():
    from jaxagent import configlib
    from jaxagent.jobs.offline import check_positions
    from jaxagent.models import preset

    qcfg = preset("tiny-qwen2", max_position_embeddings=2048)
    check_positions(2048, "sft.max_len", 4096, qcfg)  # fits exactly
    with pytest.raises(configlib.ConfigError, match=r"sft.max_len=4096: keeps rows of up to 2049 tokens, past the "
                                                    r"model's max_position_embeddings=2048.*rollout.capacity"):
        check_positions(2049, "sft.max_len", 4096, qcfg)


def test_sft_data_outside_job_sft_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="sft.data=.*expected job=sft"):
        main(["job=sft+rl", "progress=false", f"runs_dir={tmp_path}", "sft.data=x.jsonl"])


# ----------------------------------------------------------------------------- job=dpo
def _pairs_file(path):
    from jaxagent.qd.labels import Candidate, Pair, canonical_target, write_jsonl

    ask = lambda q: canonical_target(Candidate(index=1, seed=1, action="ask", question=q, rationale="r"))  # noqa: E731
    stop = canonical_target(Candidate(index=2, seed=2, action="stop"))
    pairs = []
    for i in range(6):
        prompt = f"Task {i}: who leads Quux {i}?"
        pairs.append(Pair(f"s/t{i}/seed0/t0", "synthetic", f"t{i}", "ask_ask", "gain", prompt,
                          ask(f"Who leads Quux {i}?"), ask("What is known?"), 0.1, 1, 3))
        pairs.append(Pair(f"s/t{i}/seed0/t1", "synthetic", f"t{i}", "synth_done", "stop_done", prompt + " (done)",
                          stop, ask(f"Who leads Quux {i}?"), 0.1, -1, 1))
        pairs.append(Pair(f"s/t{i}/seed0/t2", "synthetic", f"t{i}", "synth_not_done", "stop_contrast", prompt,
                          ask(f"Where is Quux {i}?"), stop, 0.1, 1, -1))
    write_jsonl(path, pairs)
    return path


DPO = ["job=dpo", "progress=false", f"tokenizer={FIXTURES / 'tokenizer_qwen'}", "model.preset=tiny-qwen2",
       "dpo.batch_size=2", "dpo.lr=3e-3", "dpo.warmup_ratio=0", "dpo.beta=0.5"]


def test_job_dpo_learns_the_stage_pairs_and_resumes_against_the_same_reference(tmp_path):
    data = _pairs_file(tmp_path / "pairs.jsonl")
    args = [*DPO, f"runs_dir={tmp_path}", "name=d2", f"dpo.data={data}", "dpo.stage=2", "dpo.epochs=6",
            "checkpoint.every=6"]
    assert main(args) == 0
    s = json.loads((tmp_path / "d2" / "summary.json").read_text())
    assert s["pairs_in_file"] == 18 and s["pairs_of_stage"] == s["pairs_trained"] == 6
    assert s["pairs_by_kind"] == {"ask_ask/gain": 6} and s["steps"] == 18
    # the policy starts as its reference: a margin of float32 rounding only (the reference is scored
    # once over all pairs, the policy per batch: other padded lengths, so other attention blocks;
    # measured 7.6e-6 with blockwise attention, 0 with XLA's), against > 0.5 after training
    assert s["first"]["reward_margin"] == pytest.approx(0.0, abs=1e-4)
    assert s["final"]["reward_accuracy"] == 1.0 and s["final"]["reward_margin"] > 0.5
    ref = np.load(tmp_path / "d2" / "checkpoints" / "dpo_reference.npy")
    assert ref.shape == (6, 2) and (tmp_path / "d2" / "hf" / "config.json").exists()
    # a resume with more epochs continues from the last checkpoint against the saved reference
    assert main([*args[:-2], "dpo.epochs=7", "checkpoint.every=6", "resume=true", "resume_overrides=[dpo.epochs]"]) == 0
    s2 = json.loads((tmp_path / "d2" / "summary.json").read_text())
    recs = [json.loads(x) for x in (tmp_path / "d2" / "metrics.jsonl").read_text().splitlines()]
    assert s2["steps"] == 21 and any(r.get("phase") == "resume" and r.get("checkpoint") == 18 for r in recs)
    np.testing.assert_array_equal(np.load(tmp_path / "d2" / "checkpoints" / "dpo_reference.npy"), ref)
    # stage 3: ask_ask + the stop contrasts, every stop_done pair left out
    assert main([*DPO, f"runs_dir={tmp_path}", "name=d3", f"dpo.data={data}", "dpo.stage=3", "dpo.epochs=1"]) == 0
    s3 = json.loads((tmp_path / "d3" / "summary.json").read_text())
    assert s3["pairs_by_kind"] == {"ask_ask/gain": 6, "synth_not_done/stop_contrast": 6}


def test_job_dpo_refuses_missing_or_empty_pairs(tmp_path):
    with pytest.raises(SystemExit, match="dpo.data=None"):
        main([*DPO, f"runs_dir={tmp_path}"])
    with pytest.raises(SystemExit, match="dpo.data=.*expected"):
        main([*DPO, f"runs_dir={tmp_path}", "name=x", f"dpo.data={tmp_path / 'missing.jsonl'}"])
    data = _pairs_file(tmp_path / "pairs.jsonl")
    with pytest.raises(SystemExit, match="dpo.max_len=8"):
        main([*DPO, f"runs_dir={tmp_path}", "name=y", f"dpo.data={data}", "dpo.max_len=8"])


def test_lora_jobs_train_the_adapter_alone_and_export_it(tmp_path):
    """model.lora.rank: job=dpo trains the adapter only (the base exported unchanged under it), writes
    the PEFT adapter and the merged checkpoint, and the two agree."""
    import jax

    from jaxagent.models import load_pretrained, save_pretrained
    from jaxagent.models.lora import merge_lora
    from jaxagent.models.lora_hf import load_peft_adapter

    base_dir = tmp_path / "base"
    cfg = preset("tiny-qwen2", vocab_size=1024, max_position_embeddings=2048)
    save_pretrained(base_dir, cfg, init_params(jax.random.key(5), cfg))
    data = _pairs_file(tmp_path / "pairs.jsonl")
    args = [*DPO, f"runs_dir={tmp_path}", "name=lora", f"dpo.data={data}", "dpo.epochs=4", f"model.path={base_dir}",
            "model.lora.rank=4", "model.lora.alpha=8"]
    args = [a for a in args if not a.startswith("model.preset")]
    assert main(args) == 0
    s = json.loads((tmp_path / "lora" / "summary.json").read_text())
    assert s["exported"] == ["hf", "adapter"] and s["final"]["reward_margin"] > 0
    c0, base = load_pretrained(base_dir)
    c1, merged = load_pretrained(tmp_path / "lora" / "hf")
    with_adapter, ca = load_peft_adapter(tmp_path / "lora" / "adapter", base, c0)
    assert ca.lora.rank == 4 and ca.lora.alpha == 8
    assert float(np.abs(np.asarray(with_adapter["lora"]["layers"]["q"]["b"])).max()) > 0  # trained
    ours, _ = merge_lora(with_adapter, ca)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(merged)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    # the base is what the job started from: the embedding (never adapted) is bitwise the base's
    np.testing.assert_array_equal(np.asarray(merged["embed"]), np.asarray(base["embed"]))
