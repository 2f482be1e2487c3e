"""``job=qd_eval`` end to end on the shipped suites: the files it writes, the summary's readings
recomputed from its own transcripts, the BCa intervals against scipy, failures counted and
stopping the job, a tiny local model as the questioner, and the synthetic suite."""

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxagent.launch import main
from jaxagent.qd import metrics as M
from jaxagent.qd.graphs import build_graphs
from jaxagent.qd.transcript import read_runs
from tests.conftest import FIXTURES

BASE = ["job=qd_eval", "progress=false", "qd.baseline=never_ask", "qd.seeds=2"]


def _run(tmp_path, name, *extra):
    assert main([*BASE, f"runs_dir={tmp_path}", f"name={name}", *extra]) == 0
    run = tmp_path / name
    return run, json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def musique(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qd")
    return _run(tmp, "m", "qd.benchmark=musique", "qd.tasks=30", "qd.first_task=10")


def test_the_job_writes_transcripts_tasks_summary_and_plots(musique):
    run, s = musique
    assert s["tasks"] == 30 and s["seeds"] == [0, 1] and "offline stand-in" in s["drafter"]
    treat, base = read_runs(run / "runs_treatment.jsonl"), read_runs(run / "runs_baseline.jsonl")
    pairs = build_graphs("musique")[10:40]
    assert [(r.task_id, r.seed) for r in treat] == [(t.task_id, k) for t, _ in pairs for k in (0, 1)]
    assert all(r.n_asks == 0 and r.stop_reason == "policy_stop" for r in base)
    assert s["arms"]["treatment"]["questioner"] == "scripted" and s["arms"]["baseline"]["questioner"] == "never_ask"
    rows = [json.loads(line) for line in (run / "tasks_treatment.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and {r["runs"] for r in rows} == {2}
    assert (run / "plots" / "frontier.png").stat().st_size > 1000 and (run / "plots" / "coverage_by_depth.png").exists()
    assert (run / "config.yaml").exists()


def test_the_summary_is_its_transcripts_readings(musique):
    run, s = musique
    graphs = dict((t.task_id, g) for t, g in build_graphs("musique"))
    treat = read_runs(run / "runs_treatment.jsonl")
    by_task = {}
    for r in treat:
        by_task.setdefault(r.task_id, []).append(M.coverage(r, graphs[r.task_id]))
    cov = np.mean([np.mean(v) for v in by_task.values()])
    arm = s["arms"]["treatment"]
    assert arm["coverage"] == pytest.approx(cov, abs=1e-12) and 0.5 < cov < 1.0
    assert arm["questions_per_task"] == pytest.approx(np.mean([r.n_asks for r in treat]), abs=1e-12)
    cells = M.stop_rates(M.stop_cells(r, graphs[r.task_id]) for r in treat)
    assert arm["stop"]["n_done"] == cells["n_done"] and arm["stop"]["forced_stops"] == cells["forced_stops"]
    assert sum(arm["stop_reasons"].values()) == 60 and arm["failed_runs"] == 0
    # the frontier's caps up to the run cap (8); larger caps need runs of a larger cap
    assert [p["cap"] for p in arm["frontier"]] == [4, 8] and arm["frontier_caps_skipped"] == [12, 16, 24]
    own = s["comparison"]["own_stop"]["coverage"]
    assert own["mean_diff"] == pytest.approx(cov, abs=1e-12) and own["n_tasks"] == 30 and own["decided"] is True
    # at equal spend against never-ask both sides are read at 0 questions: no difference
    assert s["comparison"]["equal_spend"]["coverage"]["mean_diff"] == 0.0
    # the stop 2x2 paired: each run's own rate, a task's seeds averaged; never-ask asks at no point and is never done
    rates: dict = {}
    for r in treat:
        rates.setdefault(r.task_id, []).append(M.stop_cells(r, graphs[r.task_id]).ask_when_not_done)
    awn = s["comparison"]["own_stop"]["ask_when_not_done"]
    assert awn["mean_diff"] == pytest.approx(np.mean([np.mean(v) for v in rates.values()]), abs=1e-12)
    assert awn["mean_b"] == 0.0 and awn["n_tasks"] == 30
    assert s["comparison"]["own_stop"]["stop_when_done"]["n_tasks"] == 0


def test_the_printed_intervals_match_scipy_on_the_same_differences(musique):
    run, s = musique
    rows = {json.loads(line)["task_id"]: json.loads(line) for line in (run / "tasks_treatment.jsonl").read_text()
            .splitlines()}
    d = np.asarray([rows[t]["n_asks"] - 0.0 for t in sorted(rows)])  # never-ask asks nothing
    ours = s["comparison"]["own_stop"]["questions"]["interval"]
    ref = scipy_stats.bootstrap((d,), np.mean, n_resamples=10_000, method="BCa", random_state=0).confidence_interval
    width = ref.high - ref.low
    assert abs(ours[0] - ref.low) < 0.04 * width and abs(ours[1] - ref.high) < 0.04 * width


@pytest.mark.parametrize("bench", ["strategyqa", "2wiki"])
def test_the_other_suites_run(tmp_path, bench):
    run, s = _run(tmp_path, bench, f"qd.benchmark={bench}", "qd.tasks=12", "qd.seeds=1")
    assert s["tasks"] == 12 and s["arms"]["treatment"]["coverage"] > 0.3
    assert s["unscorable_tasks"] == 0 and len(read_runs(run / "runs_treatment.jsonl")) == 12


def test_failing_drafter_calls_are_counted_and_stop_the_job(tmp_path, capsys):
    # a real HTTP client against a closed loopback port: every call fails, is retried, the run fails
    argv = [*BASE, f"runs_dir={tmp_path}", "name=down", "qd.tasks=3", "qd.seeds=1", "qd.baseline=none",
            "qd.drafter=endpoint", "qd.drafter_endpoint.base_url=http://127.0.0.1:9/v1", "qd.drafter_endpoint.model=m",
            "qd.drafter_endpoint.max_retries=0", "qd.drafter_endpoint.connect_timeout_s=1", "qd.retries=1"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert "training failed: arm treatment: 3 of 3 runs failed" in str(e.value) and "drafter.resolve" in str(e.value)
    s = json.loads((tmp_path / "down" / "summary.json").read_text())
    assert s["arms"]["treatment"]["failed_runs"] == 3 and s["arms"]["treatment"]["runs_scored"] == 0
    assert all(r.failed for r in read_runs(tmp_path / "down" / "runs_treatment.jsonl"))


def test_a_tiny_local_model_questions_through_the_engine(tmp_path):
    # random weights: its replies are malformed (counted policy stops); the path runs end to end
    run, s = _run(tmp_path, "tiny", "qd.tasks=3", "qd.seeds=1", "qd.questioner=policy", "qd.baseline=scripted",
                  f"tokenizer={FIXTURES / 'tokenizer_qwen'}", "model.preset=tiny-qwen2", "qd.max_new_tokens=24",
                  "rollout.capacity=4096", "rollout.max_tokens=4096", "rollout.slots=2")
    arm = s["arms"]["treatment"]
    assert arm["questioner"] == "local:tiny-qwen2 (random init)" and arm["runs_scored"] == 3
    runs = read_runs(run / "runs_treatment.jsonl")
    assert all(r.tokens["questioner_prompt"] > 0 for r in runs)
    assert arm["malformed"] == sum(r.malformed for r in runs) and arm["malformed"] >= 1
    assert s["comparison"]["own_stop"]["coverage"]["mean_diff"] < 0  # the heuristic beats a random model


def test_a_prompt_past_the_engine_capacity_is_a_config_error(tmp_path):
    with pytest.raises(SystemExit, match="config error: rollout.capacity=1024: the questioner's prompt"):
        main([*BASE, f"runs_dir={tmp_path}", "name=cap", "qd.tasks=1", "qd.seeds=1", "qd.questioner=policy",
              "qd.baseline=none", f"tokenizer={FIXTURES / 'tokenizer_qwen'}", "qd.max_new_tokens=600"])


def test_the_synthetic_suite_runs(tmp_path):
    from jaxagent.qd.synthetic import write_suite

    path = write_suite(tmp_path / "syn.json", 10, depth=3, breadth=2, seed=0)
    run, s = _run(tmp_path, "syn", "qd.benchmark=synthetic", f"qd.file={path}", "qd.seeds=1")
    assert s["tasks"] == 10 and s["arms"]["treatment"]["coverage"] > 0.5


def test_bad_qd_settings_are_named(tmp_path):
    for argv, needle in ((["qd.benchmark=synthetic"], "benchmark='synthetic': expected qd.file"),
                         (["qd.questioner=endpoint"], "questioner='endpoint': expected qd.questioner_endpoint"),
                         (["qd.baseline=scripted"], "baseline='scripted': the same arm as qd.questioner"),
                         (["qd.questioner=policy"], "tokenizer='builtin:gyms'"),
                         (["qd.first_task=5000"], "qd.first_task=5000: past the suite's end"),
                         ([f"qd.file={tmp_path / 'none.json'}"], "expected a readable JSON file")):
        with pytest.raises(SystemExit, match="config error") as e:
            main([*BASE, f"runs_dir={tmp_path}", *argv])
        assert needle in str(e.value), (argv, str(e.value))


def test_the_asymmetric_equal_spend_reads_the_treatment_at_its_own_end(musique):
    from jaxagent.envs.retrieval_qa.tasks import load_suite
    from jaxagent.eval.qd_report import arm_summary, compare

    run, s = musique
    graphs = dict((t.task_id, g) for t, g in build_graphs("musique"))
    tasks = {t.task_id: t for _, t in load_suite("musique")}
    treat, base = read_runs(run / "runs_treatment.jsonl"), read_runs(run / "runs_baseline.jsonl")
    asym = compare(treat, base, graphs, tasks=tasks, resamples=2000, variant="asymmetric")
    # never-ask asks nothing: the comparator is read at 0 questions, the treatment at its own stop
    assert asym["equal_spend"]["coverage"]["mean_diff"] == pytest.approx(s["arms"]["treatment"]["coverage"])
    assert asym["equal_spend_variant"] == "asymmetric" and s["comparison"]["equal_spend_variant"] == "symmetric"
    arm = arm_summary(treat, graphs, tasks=tasks)
    assert arm["breadth_components"] >= arm["breadth"] > 0  # musique: at most one facet, components >= 1
    assert 0 <= arm["breadth_components_singleton_share"] <= 1


def test_a_second_local_policy_as_the_baseline(tmp_path):
    # two checkpoints of one architecture (different random weights): each arm plays its own
    import shutil

    import jax

    from jaxagent.models import init_params, preset, save_pretrained

    cfg = preset("tiny-qwen2", vocab_size=1024, max_position_embeddings=4096)
    paths = []
    for seed in (0, 1):
        p = tmp_path / f"ckpt{seed}"
        save_pretrained(p, cfg, init_params(jax.random.key(seed), cfg))
        for f in (FIXTURES / "tokenizer_qwen").iterdir():
            shutil.copy2(f, p / f.name)
        paths.append(p)
    run, s = _run(tmp_path, "two", "qd.tasks=2", "qd.seeds=1", "qd.questioner=policy", "qd.baseline=policy",
                  f"model.path={paths[0]}", f"qd.baseline_model={paths[1]}", f"tokenizer={paths[0]}",
                  "qd.max_new_tokens=16", "rollout.capacity=4096", "rollout.max_tokens=4096", "rollout.slots=2")
    assert s["arms"]["treatment"]["questioner"] == f"local:{paths[0]}"
    assert s["arms"]["baseline"]["questioner"] == f"local:{paths[1]}"
    raws = [[r.final_raw for r in read_runs(run / f"runs_{a}.jsonl")] for a in ("treatment", "baseline")]
    assert raws[0] != raws[1]  # other weights, other replies
    with pytest.raises(SystemExit, match="baseline_model=.*expected qd.baseline=policy"):
        main([*BASE, f"runs_dir={tmp_path}", "name=bad", f"qd.baseline_model={paths[1]}"])


def test_progress_false_still_prints_the_results_table_and_where_the_files_are(tmp_path, capsys):
    run, _ = _run(tmp_path, "quiet", "qd.benchmark=strategyqa", "qd.tasks=3", "qd.seeds=1")
    err = capsys.readouterr().err
    assert f"qd_eval: results in {run} (summary.json" in err
    assert "treatment" in err and "baseline" in err   # the table's arms
    assert "[qd treatment]" not in err                 # the live lines go with progress=false
    # the comparison names its two tests (they can disagree) and the deepest need has its unit
    assert "decided=" not in err and "BCa CI excl. 0:" in err and "sign-flip p" in err
    assert "deepest need (hops)" in err
