"""The papers' tau2 evaluation protocol (`jaxagent.envs.tau2.harness`, `jaxagent.envs.tau2.table`,
``env.tau2.split``, ``eval.k``): tau2's pass^k, the component means, the scoring basis, the summary
line and the table across runs, each on hand-computed cases; the splits (retail's test split, a
withheld split's error, train and test ids for RL); the environment's default k; and
``job=eval env=tau2 env.tau2.split=test agent=oracle`` reporting avg@4 and pass^4."""

import dataclasses
import json

import pytest

from jaxagent import configlib
from jaxagent.envs import tau2
from jaxagent.envs.registry import DemoRequest, EnvContext, EnvSpec, resolve_env
from jaxagent.envs.tau2.domains.retail import RETAIL
from jaxagent.envs.tau2.harness import (
    Tau2EnvFactory,
    component_means,
    is_success,
    pass_hat_k,
    pass_hat_ks,
    pass_hats,
    per_task,
    scoring_basis,
    summarize,
    summary_line,
    summary_text,
)
from jaxagent.envs.tau2.spec import TAU2, TAU2_RETAIL, Tau2Section
from jaxagent.envs.tau2.table import load_summary, markdown_table
from jaxagent.envs.tau2.table import main as table_main
from jaxagent.envs.tau2.tasks import TaskError, check_split, load_task_set, parse_task, split_file
from jaxagent.jobs.config import load_config
from jaxagent.jobs.sections import EvalSection
from jaxagent.launch import main

TRAIN = load_task_set(split="train")
TEST = load_task_set(split="test")


def _rep(task_id, reward, termination="user_stop", **components):
    return {"task_id": task_id, "termination": termination,
            "score": {"reward": reward, "components": components} if components or reward else None}


# ============================================================================ tau2's metrics
def test_pass_hat_k_is_comb_c_k_over_comb_n_k():
    # 4 runs, 2 successes: pass^1 = 2/4; pass^2 = C(2,2)/C(4,2) = 1/6; pass^3 = 0 (fewer successes than k)
    assert pass_hat_k(4, 2, 1) == 0.5
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(4, 2, 3) == 0.0
    # n == k: "all k runs succeed"
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(4, 3, 4) == 0.0
    # 5 runs, 3 successes, k = 2: C(3,2)/C(5,2) = 3/10
    assert pass_hat_k(5, 3, 2) == pytest.approx(0.3)
    for n, c, k in ((4, 2, 5), (4, 5, 1), (4, 2, 0), (4, -1, 1)):
        with pytest.raises(ValueError, match=rf"pass_hat_k\(n={n}, c={c}, k={k}\): expected integers with 1 <= k <= n"):
            pass_hat_k(n, c, k)


def test_pass_hat_ks_average_over_tasks_up_to_the_fewest_runs():
    # a: 3 of 4, b: 4 of 4
    hat = pass_hat_ks({"a": [True, True, False, True], "b": [True] * 4})
    # pass^1 = (3/4 + 1)/2; pass^2 = (C(3,2)/C(4,2) + 1)/2 = (1/2 + 1)/2; pass^3 = (1/4 + 1)/2; pass^4 = (0 + 1)/2
    assert hat == pytest.approx({1: 0.875, 2: 0.75, 3: 0.625, 4: 0.5})
    # tau2: max k is the fewest runs of any task
    assert pass_hat_ks({"a": [True, False], "b": [True, True, True]}) == pytest.approx({1: 0.75, 2: 0.5})
    with pytest.raises(ValueError, match="expected at least one task, each with at least one run"):
        pass_hat_ks({"a": []})


def test_is_success_is_a_reward_within_1e6_of_one():
    assert is_success(1.0) and is_success(1 - 1e-7) and is_success(1 + 1e-7)
    assert not is_success(0.999) and not is_success(0.0)


def test_component_means_over_the_episodes_that_computed_each():
    reps = [_rep("a", 1.0, DB=1.0, COMMUNICATE=1.0, ACTION=0.0, NL_ASSERTION=1.0),
            _rep("b", 0.0, DB=0.0, COMMUNICATE=1.0, ACTION=1.0),         # a task without NL assertions in its basis
            _rep("c", 0.0, termination="simulator_failure")]              # never scored: 0 for every component
    means = component_means(reps)
    assert list(means) == ["DB", "NL_ASSERTION", "COMMUNICATE", "ACTION"]  # tau2's order
    # DB (1 + 0 + 0)/3, COMMUNICATE (1 + 1 + 0)/3, ACTION (0 + 1 + 0)/3, NL_ASSERTION over a and c: (1 + 0)/2
    assert means == pytest.approx({"DB": 1 / 3, "COMMUNICATE": 2 / 3, "ACTION": 1 / 3, "NL_ASSERTION": 0.5})
    assert component_means([_rep("c", 0.0, termination="unfinished")]) == {}


# ============================================================================ the scoring basis
def test_scoring_basis_names_what_the_offline_reward_leaves_out():
    tasks = list(TEST.values())
    off = scoring_basis(tasks, "offline")
    assert off["reward"] == "DB x COMMUNICATE" and off["tau2_basis"] == {"DB x NL_ASSERTION": 39, "DB": 1}
    assert list(off["left_out"]) == ["NL_ASSERTION"] and "no judge configured" in off["left_out"]["NL_ASSERTION"]
    assert off["in_place"] == ["COMMUNICATE"]
    assert off["note"] == ("offline: reward = DB x COMMUNICATE; tau2's basis: DB x NL_ASSERTION (39 tasks), DB (1 task);"
                           " left out: NL_ASSERTION (no judge configured: env.tau2.scoring=tau2 with env.tau2.judge "
                           "scores it); COMMUNICATE in its place")
    judged = scoring_basis(tasks, "tau2")
    assert judged["reward"] == "tau2's basis" and judged["left_out"] == {} and judged["in_place"] == []
    assert judged["note"].endswith("; nothing left out")
    # a domain whose basis is DB x COMMUNICATE (airline's): the offline reward is tau2's
    raw = {"id": "x", "user_scenario": {"instructions": {"domain": "d", "reason_for_call": "r", "task_instructions": "t"}},
           "evaluation_criteria": {"reward_basis": ["DB", "COMMUNICATE"]}}
    same = scoring_basis([parse_task(raw)], "offline")
    assert same["left_out"] == {} and same["in_place"] == [] and same["tau2_basis"] == {"DB x COMMUNICATE": 1}
    assert same["note"] == "offline: reward = DB x COMMUNICATE; tau2's basis: DB x COMMUNICATE (1 task); nothing left out"
    with pytest.raises(ValueError, match="scoring_mode='judge': expected one of 'offline', 'tau2'"):
        scoring_basis(tasks, "judge")


# ============================================================================ summaries
def _four_runs():
    """Task '5': 4 of 4 runs solved; task '9': 2 of 4 (one stopped by max_steps)."""
    ok = {"DB": 1.0, "COMMUNICATE": 1.0, "ACTION": 1.0}
    return ([_rep("5", 1.0, **ok) for _ in range(4)]
            + [_rep("9", 1.0, **ok), _rep("9", 0.0, DB=0.0, COMMUNICATE=1.0, ACTION=0.0), _rep("9", 1.0, **ok),
               _rep("9", 0.0, termination="max_steps", DB=1.0, COMMUNICATE=0.0, ACTION=1.0)])


def test_summarize_reports_avg_at_k_pass_hat_and_components():
    s = summarize(_four_runs(), scoring_mode="offline", k=4, tasks=TEST)
    assert (s["episodes"], s["tasks"], s["k"]) == (8, 2, 4)
    assert s["reward"] == 0.75 and s["success"] == 0.75  # 6 of 8 episodes
    # pass^j: task 5 gives 1; task 9 (2 of 4) gives C(2,j)/C(4,j) = 1/2, 1/6, 0, 0
    assert pass_hats(s) == pytest.approx({1: 0.75, 2: (1 + 1 / 6) / 2, 3: 0.5, 4: 0.5})
    assert s["pass_hat_1"] == 0.75 and s["pass_hat_3"] == 0.5  # tau2's names
    assert s["pass_hat_k"] == 0.5 and s["pass_at_k"] == 1.0
    assert s["components"] == {"DB": 0.875, "COMMUNICATE": 0.875, "ACTION": 0.875}
    assert s["db"] == 0.875 and s["communicate"] == 0.875
    assert s["terminations"] == {"user_stop": 7, "max_steps": 1}
    assert s["success_by_task"] == {"5": 1.0, "9": 0.5}
    assert s["scoring"]["tau2_basis"] == {"DB x NL_ASSERTION": 2} and s["scoring_note"] == s["scoring"]["note"]
    assert "NL_ASSERTION" in s["scoring"]["left_out"]
    with pytest.raises(ValueError, match=r"task ids \['5', '9'\] are not among the 74 tasks given"):
        summarize(_four_runs(), scoring_mode="offline", k=4, tasks=TRAIN)
    # fewer runs than k for some task: pass^j up to the fewest, pass^k unknown
    short = summarize(_four_runs()[:6], scoring_mode="offline", k=4)
    assert set(pass_hats(short)) == {1, 2} and "pass_hat_3" not in short and short["pass_hat_k"] is None


def test_per_task_rows_carry_successes_and_components():
    rows = per_task(_four_runs())
    assert [(r["task_id"], r["runs"], r["successes"], r["reward"], r["success"]) for r in rows] == [
        ("5", 4, 4, 1.0, 1.0), ("9", 4, 2, 0.5, 0.5)]
    assert rows[1]["components"] == {"DB": 0.75, "COMMUNICATE": 0.75, "ACTION": 0.75}
    assert rows[1]["terminations"] == {"user_stop": 3, "max_steps": 1}


def test_summary_line_names_domain_split_k_figures_and_scoring():
    s = {"domain": "retail", "split": "test", "agent": "oracle", "customer": "scripted",
         **summarize(_four_runs(), scoring_mode="offline", k=4, tasks=TEST)}
    assert summary_line(s) == (
        "tau2 retail/test agent=oracle: 2 tasks x k=4 | avg@4 0.750 success 0.750 pass^4 0.500 | "
        "DB 0.875 COMMUNICATE 0.875 ACTION 0.875 | offline DB x COMMUNICATE, NL_ASSERTION left out")
    lines = summary_text(s).splitlines()
    assert lines[0] == summary_line(s) and len(lines) == 4
    assert lines[1].startswith("  customer scripted, 8 episodes; scoring offline: reward = DB x COMMUNICATE")
    assert lines[2] == "  pass^1 0.750  pass^2 0.583  pass^3 0.500  pass^4 0.500  pass@4 1.000"
    assert lines[3] == "  terminations: user_stop 7, max_steps 1"


# ============================================================================ the table across runs
def _fake_summaries():
    retail = {"domain": "retail", "split": "test", "agent": "oracle", "tasks": 40, "k": 4, "reward": 0.5,
              "pass_hat_1": 0.5, "pass_hat_2": 0.25, "pass_hat_3": 0.125, "pass_hat_4": 0.0625,
              "components": {"DB": 0.75, "COMMUNICATE": 0.5, "ACTION": 0.25}, "scoring_mode": "offline",
              "scoring": {"reward": "DB x COMMUNICATE", "left_out": {"NL_ASSERTION": "no judge"}}}
    airline = {"domain": "airline", "split": "train", "agent": "endpoint", "tasks": 30, "k": 2, "reward": 0.2,
               "pass_hat_1": 0.2, "pass_hat_2": 0.1, "components": {"DB": 0.3, "COMMUNICATE": 0.4, "ACTION": 0.5},
               "scoring_mode": "tau2", "scoring": {"reward": "tau2's basis", "left_out": {}}}
    return retail, airline


def test_markdown_table_of_two_summaries():
    assert markdown_table(_fake_summaries()).splitlines() == [
        ("| domain | split | agent | tasks | k | avg reward | pass^1 | pass^2 | pass^3 | pass^4 | DB | COMMUNICATE "
         "| scoring |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ("| retail | test | oracle | 40 | 4 | 0.500 | 0.500 | 0.250 | 0.125 | 0.062 | 0.750 | 0.500 "
         "| offline: DB x COMMUNICATE (NL_ASSERTION left out) |"),
        "| airline | train | endpoint | 30 | 2 | 0.200 | 0.200 | 0.100 | - | - | 0.300 | 0.400 | tau2: tau2's basis |"]
    judged = dict(_fake_summaries()[1], components={"DB": 1.0, "COMMUNICATE": 1.0, "NL_ASSERTION": 0.5})
    lines = markdown_table([judged]).splitlines()
    assert lines[0].endswith("| DB | COMMUNICATE | NL_ASSERTION | scoring |") and "| 0.500 | tau2:" in lines[2]
    with pytest.raises(ValueError, match="summaries: empty"):
        markdown_table([])


def test_table_reads_run_directories(tmp_path, capsys):
    for name, s in zip(("r", "a"), _fake_summaries()):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
    assert load_summary(tmp_path / "r")["domain"] == "retail"
    assert load_summary(tmp_path / "a" / "summary.json")["source"] == str(tmp_path / "a" / "summary.json")
    assert table_main([str(tmp_path / "r"), str(tmp_path / "a")]) == 0
    assert capsys.readouterr().out.splitlines() == markdown_table(_fake_summaries()).splitlines()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "summary.json").write_text(json.dumps({"reward": 1.0, "tasks": 3, "k": 1}))
    with pytest.raises(ValueError, match=r"summary.json: lacks domain, split, pass_hat_1, components, scoring_mode"):
        load_summary(tmp_path / "old")
    assert table_main([str(tmp_path / "old")]) == 2 and "lacks domain" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no summary.json there"):
        load_summary(tmp_path / "nowhere")


# ============================================================================ splits
def test_retail_ships_its_test_split_disjoint_from_train():
    assert len(TRAIN) == 74 and len(TEST) == 40 and not set(TRAIN) & set(TEST)
    assert list(TEST)[:4] == ["5", "9", "12", "17"] and all(t.domain == "retail" for t in TEST.values())
    assert sum(t.reward_basis == ("DB",) for t in TEST.values()) == 1
    assert split_file(None, "test") == RETAIL.data_dir / "tasks_test.json"
    with pytest.raises(TaskError, match="split='dev': expected one of 'train', 'test'"):
        load_task_set(None, "dev")


def test_a_withheld_split_names_the_missing_file(tmp_path, monkeypatch):
    """A domain that ships train only (as airline does): split=test is an error naming the file and
    saying the split is not shipped; the file dropped in, the split loads."""
    (tmp_path / "tasks_train.json").write_text((RETAIL.data_dir / "tasks_train.json").read_text())
    monkeypatch.setitem(tau2._LOADED, "withheld", dataclasses.replace(
        RETAIL, name="withheld", data_dir=tmp_path, task_files={"train": "tasks_train.json"}))
    with pytest.raises(FileNotFoundError) as info:
        load_task_set(None, "test", domain="withheld")
    msg = str(info.value)
    assert msg.startswith("split='test': the tau2 withheld test split is not shipped with the package (")
    assert str(tmp_path / "tasks_test.json") in msg and "shipped: train" in msg and "expected split='train'" in msg
    (tmp_path / "tasks_test.json").write_text((RETAIL.data_dir / "tasks_test.json").read_text())
    assert check_split(None, "test", "withheld") == tmp_path / "tasks_test.json"  # tau2's file name by default
    assert list(load_task_set(None, "test", domain="withheld")) == list(TEST)


def test_split_is_validated_at_config_load(tmp_path):
    base = ["job=eval", "env.kind=tau2", "eval.agent=oracle"]
    with pytest.raises(configlib.ConfigError, match=r"env.tau2.split: 'dev' is not one of 'train', 'test'"):
        load_config(None, base + ["env.tau2.split=dev"])
    (tmp_path / "tasks_train.json").write_text("[]")
    with pytest.raises(configlib.ConfigError, match=r"^env\.tau2\.split='test': .*tasks_test\.json does not exist"):
        load_config(None, base + ["env.tau2.split=test", f"env.tau2.data_dir={tmp_path}"])
    with pytest.raises(ValueError, match="split='dev': expected one of 'train', 'test'"):
        Tau2Section(split="dev")
    assert load_config(None, base + ["env.tau2.split=test"]).env.tau2.split == "test"


def test_airline_test_split_is_refused_as_not_shipped():
    if split_file(None, "test", "airline").is_file():
        pytest.skip("airline's test split has been dropped in")
    with pytest.raises(configlib.ConfigError, match=r"env\.tau2\.split='test': the tau2 airline test split is not "
                                                     r"shipped with the package \(.*tasks_test\.json does not exist"):
        load_config(None, ["job=eval", "env.kind=tau2", "env.tau2.domain=airline", "env.tau2.split=test",
                                 "eval.agent=oracle"])


def test_training_uses_the_train_split_and_evaluation_the_chosen_one():
    same = TAU2.build(EnvContext(settings=load_config(None, ["env.kind=tau2", "tokenizer=x"]).env, train_tasks=100,
                                 test_tasks=100))
    assert same.train_tasks == same.test_tasks == list(TRAIN)  # split=train: no held-out set (as before splits)
    env = load_config(None, ["env.kind=tau2", "tokenizer=x", "env.tau2.split=test", "env.tau2.tasks=0:5"]).env
    held = TAU2.build(EnvContext(settings=env, train_tasks=10, test_tasks=3))
    assert held.train_tasks == list(TRAIN)[:10] and held.test_tasks == ["5", "9", "12"]
    assert len(held.factory.tasks) == 74 + 40 and held.factory.task_ids == list(TEST)[:5]
    demos = TAU2.demonstrations(EnvContext(settings=env, train_tasks=10), held, DemoRequest(n=2))
    assert [t for t, _ in demos.episodes] == ["0", "1"]  # SFT: train tasks


def test_a_test_split_sharing_ids_with_train_is_refused(tmp_path):
    raw = json.loads((RETAIL.data_dir / "tasks_train.json").read_text())
    (tmp_path / "tasks_train.json").write_text(json.dumps(raw[:2]))
    (tmp_path / "tasks_test.json").write_text(json.dumps(raw[1:3]))
    with pytest.raises(TaskError, match=r"split='test': task ids \['1'\] are in both the train and the test split"):
        Tau2EnvFactory(Tau2Section(split="test", data_dir=str(tmp_path)))


# ============================================================================ eval.k: the environment's default
def test_eval_k_defaults_to_the_environments_k():
    assert TAU2.eval_k == TAU2_RETAIL.eval_k == 4 and resolve_env("gym").eval_k == 1
    assert EvalSection().k is None
    assert EvalSection().runs_per_task(TAU2) == 4 and EvalSection().runs_per_task(resolve_env("gym")) == 1
    assert EvalSection(k=1).runs_per_task(TAU2) == 1 and EvalSection(k=3).runs_per_task(resolve_env("gym")) == 3
    cfg = load_config(None, ["job=eval", "env.kind=tau2_retail", "eval.agent=oracle", "eval.k=1"])
    assert cfg.eval.k == 1 and cfg.eval.runs_per_task(cfg.env.spec) == 1
    with pytest.raises(configlib.ConfigError, match=r"eval.k=0: expected an integer >= 1, or null"):
        load_config(None, ["eval.k=0"])
    with pytest.raises(ValueError, match=r"EnvSpec 'x': eval_k=0; expected an integer >= 1"):
        EnvSpec(name="x", build=lambda ctx: None, eval_k=0)


# ============================================================================ job=eval: the protocol end to end
def test_job_eval_on_the_test_split_reports_avg_at_4_and_pass_hat_4(tmp_path, capsys):
    assert main(["job=eval", "env=tau2", "env.tau2.split=test", "agent=oracle", "env.tau2.tasks=0:3",
                 f"runs_dir={tmp_path}", "name=t"]) == 0
    s = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert (s["domain"], s["split"], s["agent"], s["tasks"], s["k"], s["episodes"]) == ("retail", "test", "oracle",
                                                                                       3, 4, 12)
    assert s["reward"] == 1.0 and pass_hats(s) == {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0} and s["pass_hat_k"] == 1.0
    assert s["components"] == {"DB": 1.0, "COMMUNICATE": 1.0, "ACTION": 1.0}
    assert list(s["scoring"]["left_out"]) == ["NL_ASSERTION"] and (s["max_steps"], s["max_errors"]) == (200, 10)
    rows = [json.loads(line) for line in (tmp_path / "t" / "tasks.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["runs"], r["successes"]) for r in rows] == [("5", 4, 4), ("9", 4, 4), ("12", 4, 4)]
    err = capsys.readouterr().err
    assert ("tau2 retail/test agent=oracle: 3 tasks x k=4 | avg@4 1.000 success 1.000 pass^4 1.000 | DB 1.000 "
            "COMMUNICATE 1.000 ACTION 1.000 | offline DB x COMMUNICATE, NL_ASSERTION left out") in err
    # the papers' turn limit, and an explicit k
    assert main(["job=eval", "env=tau2", "env.tau2.split=test", "agent=oracle", "env.tau2.tasks=0:1",
                 "env.tau2.max_steps=50", "eval.k=1", f"runs_dir={tmp_path}", "name=t50", "progress=false"]) == 0
    s50 = json.loads((tmp_path / "t50" / "summary.json").read_text())
    assert (s50["k"], s50["episodes"], s50["max_steps"], pass_hats(s50)) == (1, 1, 50, {1: 1.0})


# ============================================================================ scripts/eval_tau2_oracle.py
def _oracle_script():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("eval_tau2_oracle",
                                                  Path(__file__).parents[1] / "scripts" / "eval_tau2_oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fault, status, says", [
    (None, 0, None),
    ("miss", 1, "oracle missed reward 1 on retail/test task 9"),
    ("leak", 1, "broken variant wrong_argument scored above 0 on retail/test task 5"),
])
def test_oracle_script_exits_1_on_a_miss_or_a_leak(monkeypatch, capsys, fault, status, says):
    script = _oracle_script()
    ok = {"DB": 1.0, "COMMUNICATE": 1.0, "ACTION": 1.0}

    async def run(domain, split, data_dir, k):  # two tasks instead of the 40 episodes' worth
        oracle = [{"task_id": t, "termination": "user_stop", "seed": 0,
                   "score": {"reward": 0.0 if (fault, t) == ("miss", "9") else 1.0, "components": ok,
                             "scoring_mode": "offline"}} for t in ("5", "9")]
        broken = [{"task_id": "5", "termination": "user_stop", "agent": "wrong_argument",
                   "reward": 1.0 if fault == "leak" else 0.0, "components": dict(ok, DB=float(fault == "leak"))}]
        return oracle, broken, True

    monkeypatch.setattr(script, "run", run)
    assert script.main(["--domain", "retail", "--split", "test"]) == status
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("tau2 retail/test agent=oracle: 2 tasks x k=1 | avg@1 ")
    assert lines[1] == f"  broken variants: 1 (wrong_argument 1), {int(fault != 'leak')} scored 0"
    assert lines[3].startswith("| domain | split | agent | tasks | k | avg reward | pass^1 |")
    final = json.loads(lines[-1])
    assert (final["missed"], final["leaked"]) == (int(fault == "miss"), int(fault == "leak"))
    assert says in err if says else err.splitlines()[:-1] == []  # nothing but the last line: where the results are
    assert err.splitlines()[-1].startswith("eval_tau2_oracle: done in ") and "results above" in err.splitlines()[-1]


def test_oracle_script_refuses_a_split_the_named_domain_does_not_ship(capsys):
    if split_file(None, "test", "airline").is_file():
        pytest.skip("airline's test split has been dropped in")
    assert _oracle_script().main(["--domain", "airline", "--split", "test"]) == 2
    assert "the tau2 airline test split is not shipped" in capsys.readouterr().err
