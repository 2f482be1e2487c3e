"""Weights & Biases as an optional extra (`jaxagent.jobs.wandb_log`), with the real ``wandb``
package in offline mode (no network): the files it writes are read back.

- a tiny ``job=rl`` launched with ``log.wandb=true log.wandb_mode=offline`` writes an offline
  run under ``runs/<name>/wandb/`` holding every scalar TensorBoard got, under the same name, at
  the same step (each phase on its own step axis: none dropped), one trajectory table per RL
  iteration (the columns of `TABLE_COLUMNS`, at most ``log.wandb_table_rows`` rows) and the plots;
- the sink alone: scalars named as `TensorBoardWriter` names them; a table's rows from a
  hand-made trajectory record (reward, success, per-turn rewards, reactions, feedback, transcript);
- a resumed run (``resume=true``) continues the same W&B run id;
- without the package, ``log.wandb=true`` is refused before anything is built (a dry run too),
  naming the key and ``pip install 'jaxagent[wandb]'``.

The ``.wandb`` file is a LevelDB-style log of ``wandb_internal_pb2.Record`` protobufs (wandb 0.31
ships no Python reader for it): `_wandb_records` reads it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import sys
import time
from pathlib import Path

import pytest

wandb = pytest.importorskip("wandb")

from jaxagent.eval.report import TensorBoardWriter, read_metrics
from jaxagent.jobs.config import load_config
from jaxagent.jobs.wandb_log import (
    RUN_ID_FILE,
    TABLE_COLUMNS,
    TABLE_KEY,
    WandbMissing,
    WandbSink,
    check_wandb,
    open_wandb,
    table_rows,
)
from jaxagent.launch import main
from jaxagent.rollout.trajectory import Trajectory
from jaxagent.text.spans import MessageSpan

TINY = ["job=rl", "steps=2", "eval.tasks=1", "eval.every=0", "rl.tasks_per_step=1", "rl.group_size=2",
        "rl.minibatch_size=2", "rollout.max_turns=2", "rollout.slots=2", "rollout.max_new_tokens=16",
        "rollout.max_tokens=256", "rollout.capacity=256", "model.num_hidden_layers=1", "checkpoint.every=0",
        "checkpoint.export_hf=false", "progress=false"]
WANDB = ["log.wandb=true", "log.wandb_mode=offline", "log.wandb_project=jaxagent-test", "log.wandb_table_rows=1"]


def _offline_env(mp: pytest.MonkeyPatch, home: Path) -> None:
    """No network, no output, nothing written outside the test's folders."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(home),
                       "WANDB_CONFIG_DIR": str(home / "config"), "WANDB_CACHE_DIR": str(home / "cache"),
                       "WANDB_DATA_DIR": str(home / "data"), "WANDB_DISABLE_GIT": "true"}.items():
        mp.setenv(key, value)


@pytest.fixture(autouse=True)
def _offline(tmp_path_factory, monkeypatch):
    _offline_env(monkeypatch, tmp_path_factory.mktemp("wandb-home"))


# ----------------------------------------------------------------------------- readers
def _wandb_records(path: Path) -> list:
    """The records of a ``run-<id>.wandb`` file: a ``:W&B`` header (7 bytes), then LevelDB log
    chunks (32 KiB blocks; each chunk: crc32 u32, length u16, type u8 = full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    out, pos, block, buf = [], 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header: padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:
            pos += left
            continue
        if pos + 7 + n > len(data):  # a chunk still being written: the records before it
            break
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def _finished_records(path: Path, timeout_s: float = 120.0) -> list:
    """The records of a finished run's ``.wandb`` file, once its ``exit`` record is there.

    ``run.finish()`` returns when wandb-core has handled the exit record, but the stream that
    writes the file is closed by a request the SDK only publishes (``inform_finish``, no reply):
    the file's tail can still be unwritten when ``finish`` returns (two CI runs failed on a file
    with no history rows; a probe read once found the 7-byte header alone). The file is complete
    once it holds the exit record, so it is read until then."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _wandb_records(path) if path.stat().st_size >= 7 else []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            kinds = [r.WhichOneof("record_type") for r in records]
            raise AssertionError(f"{path} has no exit record {timeout_s:.0f} s after finish: {kinds}")
        time.sleep(0.05)


def _history(run_dir: Path) -> tuple[list[dict], list]:
    """(the history rows, key -> JSON value, in logging order; every record) of a run's one offline run."""
    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    records = _finished_records(files[0])
    rows = [{"/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    return rows, records


def _scalar_series(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """``name -> [(its phase's step, value), ...]`` from the history rows (W&B's own keys, the
    ``<phase>/step`` axes and the table's and images' fields left out)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(("_", TABLE_KEY, "plots/")) or key.endswith("/step"):
                continue
            out.setdefault(key, []).append((row[key.split("/", 1)[0] + "/step"], value))
    return out


def _tb_series(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value), ...]`` from the TensorBoard event files (TFRecord framing: length
    u64, its crc u32, the ``Event`` protobuf, its crc u32)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(tb_dir.glob("events.out.tfevents.*")):
        data, pos = f.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return out


def _same_series(got: dict, tb: dict) -> None:
    assert sorted(got) == sorted(tb)
    for tag, series in tb.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in series], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in series], rel=1e-6, abs=1e-6), tag  # TB: float32


def _tables(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("wandb/offline-run-*/files/media/table/rl/*.table.json"))]


# ----------------------------------------------------------------------------- a run
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A two-iteration job=rl on the intention gym (one layer), logged to W&B offline."""
    runs = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        _offline_env(mp, tmp_path_factory.mktemp("wandb-home"))
        assert main(TINY + WANDB + [f"runs_dir={runs}", "name=w"]) == 0
    return runs / "w"


def test_an_offline_run_holds_every_tensorboard_scalar_the_tables_and_the_plots(tiny_run):
    run = tiny_run
    rows, records = _history(run)
    # the run: named after the run, in the project asked for, with the resolved config
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert start.run_id == (run / RUN_ID_FILE).read_text().strip()
    assert start.display_name == "w" and start.project == "jaxagent-test"
    config = {u.key: json.loads(u.value_json) for u in start.config.update}
    assert config["job"] == "rl" and config["steps"] == 2 and config["log"]["wandb"] is True
    # every scalar TensorBoard got, same name, same step, same value: phases on their own axes
    _same_series(_scalar_series(rows), _tb_series(run / "tb"))
    by_phase = {}
    for r in read_metrics(run / "metrics.jsonl"):
        by_phase.setdefault(r["phase"], []).append(r["step"])
    got = _scalar_series(rows)
    assert [s for s, _ in got["rl/reward"]] == by_phase["rl"] == [0, 1]
    assert [s for s, _ in got["eval/success"]] == by_phase["eval"] == [0, 2]
    # each metric is defined against its phase's step (no x-axis is W&B's global _step)
    metrics = {m.metric.name: m.metric.step_metric for m in records if m.WhichOneof("record_type") == "metric"}
    assert metrics["rl/reward"] == "rl/step" and metrics["eval/success"] == "eval/step"
    assert metrics[TABLE_KEY] == "rl/step"
    # one table per RL iteration, at that iteration's rl/step, log.wandb_table_rows=1 row each
    table_rows_ = [r for r in rows if f"{TABLE_KEY}/path" in r]
    assert [r["rl/step"] for r in table_rows_] == [0, 1]
    tables = _tables(run)
    assert len(tables) == 2
    for i, table in enumerate(sorted(tables, key=lambda t: t["data"][0][0])):
        assert table["columns"] == list(TABLE_COLUMNS)
        assert len(table["data"]) == 1
        row = dict(zip(table["columns"], table["data"][0]))
        episode = json.loads((run / "trajectories" / f"iter_{i:05d}.jsonl").read_text().splitlines()[0])
        assert row["iteration"] == i and row["task"] == episode["task_id"]
        assert row["reward"] == pytest.approx(episode["outcome_reward"])
        assert json.loads(row["turn_rewards"]) == pytest.approx(episode["turn_rewards"])
        assert row["turns"] == len(json.loads(row["turn_reactions"])) == len(json.loads(row["turn_feedback"]))
        assert row["turns"] == len(episode["turn_rewards"])
        # the credit the update gave each turn, as the trajectory record holds it
        assert json.loads(row["turn_advantage"]) == episode["info"]["credit"]["advantage"]
        assert len(json.loads(row["turn_advantage"])) == row["turns"] and "credit" not in json.loads(row["info"])
        assert "[user]" in row["transcript"] and "[assistant]" in row["transcript"]
    # the plots, as images under plots/<name>
    plots = sorted(p.stem for p in (run / "plots").glob("*.png"))
    images = sorted(k.split("/")[1] for r in rows for k in r if k.startswith("plots/") and k.endswith("/_type"))
    assert plots and images == plots
    files = list(run.glob("wandb/offline-run-*/files/media/images/plots/*.png"))
    assert sorted(f.name for f in files) == sorted(Path(r[f"plots/{n}/path"]).name for r in rows for n in plots
                                                   if f"plots/{n}/path" in r)
    assert json.loads((run / "summary.json").read_text())["plots"]
    # the run finished: an exit record with code 0
    (exit_,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_.exit_code == 0


# ----------------------------------------------------------------------------- the sink alone
def _record() -> dict:
    """system, user, assistant, user (reaction "correct"), assistant; the episode ends on a "reject"."""
    roles = ["system", "user", "assistant", "user", "assistant"]
    spans, tokens, pos = [], [], 0
    for i, role in enumerate(roles):
        gen = role == "assistant"
        content = [10 * (i + 1) + k for k in range(3)]
        # template prefix (1 token), content, (a stop token for a generated message), suffix (1 token)
        start, cs = pos, pos + 1
        ce = cs + len(content)
        ge = ce + 1 if gen else cs
        end = (ge if gen else ce) + 1
        tokens += [1] + content + ([2] if gen else []) + [3]
        spans.append(MessageSpan(index=i, role=role, start=start, end=end, content_start=cs, content_end=ce,
                                 generated=gen, generated_end=ge))
        pos = end
    t = Trajectory(task_id="intention:train:7", group_id=3, tokens=tokens, logprobs=[0.0] * len(tokens), spans=spans,
                   turn_rewards=[0.25, 0.5], outcome_reward=1.0,
                   reaction_labels=[None, None, None, "correct", None], final_reaction="reject",
                   message_kinds=[None, None, None, "correction", None],
                   info={"partial": 0.5, "credit": {"advantage": [0.5, None], "r_info": [0.125, -0.25]}})
    return t.to_dict()


def test_table_rows_from_a_trajectory_record():
    rec = _record()
    (row,) = table_rows(4, [rec], decode=lambda ids: "<" + ",".join(map(str, ids)) + ">", success_threshold=1.0)
    row = dict(zip(TABLE_COLUMNS, row))
    assert row["iteration"] == 4 and row["task"] == "intention:train:7" and row["group"] == 3
    assert row["reward"] == 1.0 and row["success"] is True and row["turns"] == 2
    assert row["termination"] == "done" and row["final_reaction"] == "reject"
    assert json.loads(row["turn_rewards"]) == [0.25, 0.5]
    # turn 0: the segment the "correct" user message ends; turn 1: the last segment, the final reaction
    assert json.loads(row["turn_reactions"]) == ["correct", "reject"]
    assert json.loads(row["turn_feedback"]) == ["correction", None]
    assert json.loads(row["info"]) == {"partial": 0.5}
    assert json.loads(row["turn_advantage"]) == [0.5, None]
    assert json.loads(row["turn_credit"]) == {"r_info": [0.125, -0.25]}
    assert row["transcript"].splitlines() == ["[system] <10,11,12>", "[user] <20,21,22>", "[assistant] <30,31,32,2>",
                                              "[user] <40,41,42>", "[assistant] <50,51,52,2>"]
    (row,) = table_rows(0, [rec], success_threshold=1.5)  # no tokenizer: the token ids
    assert row[TABLE_COLUMNS.index("success")] is False
    assert row[TABLE_COLUMNS.index("transcript")].splitlines()[0] == "[system] 10 11 12"


def test_the_sink_names_scalars_as_tensorboard_and_logs_a_table(tmp_path):
    metrics = {"loss": 0.5, "finite": True, "n": 3, "np": __import__("numpy").float32(0.25), "nan": math.nan,
               "inf": math.inf, "by_task": [1, 2], "label": "before", "none": None, "time": 1.0, "step": 9,
               "update/kl_ref": 0.125}
    with TensorBoardWriter(tmp_path / "tb") as tb:
        for phase, step in (("sft", 0), ("sft", 1), ("rl", 0), ("eval", 0)):
            tb.scalars(step, metrics, phase)
    run = wandb.init(project="jaxagent-test", mode="offline", dir=str(tmp_path), reinit="create_new")
    sink = WandbSink(run, tmp_path, table_rows=2, decode=None)
    for phase, step in (("sft", 0), ("sft", 1), ("rl", 0), ("eval", 0)):
        assert sink.scalars(phase, step, metrics) == 5  # loss, finite, n, np, update/kl_ref
    assert sink.table(0, [_record()] * 3) == 2  # at most table_rows
    sink.finish()
    sink.finish()  # once
    rows, _ = _history(tmp_path)
    _same_series(_scalar_series(rows), _tb_series(tmp_path / "tb"))
    assert "sft/update/kl_ref" in _scalar_series(rows)
    (table,) = _tables(tmp_path)
    assert table["columns"] == list(TABLE_COLUMNS) and len(table["data"]) == 2


def test_the_pending_table_is_read_from_the_trajectories_file(tmp_path):
    """`WandbSink.log`: an RL step's table is logged by the next call (its file is written just
    after its scalars), the last one by `finish`; a file cut short keeps its whole lines."""
    traj = tmp_path / "trajectories"
    traj.mkdir()
    run = wandb.init(project="jaxagent-test", mode="offline", dir=str(tmp_path), reinit="create_new")
    sink = WandbSink(run, tmp_path, table_rows=8)
    line = json.dumps(_record())
    sink.log("rl", 0, {"reward": 1.0})
    (traj / "iter_00000.jsonl").write_text(line + "\n" + line + "\n")
    sink.log("rl", 1, {"reward": 0.0})  # logs iteration 0's table
    (traj / "iter_00001.jsonl").write_text(line + "\n" + line[:40])  # a crash mid-line
    sink.finish()  # logs iteration 1's
    rows, _ = _history(tmp_path)
    assert [r["rl/step"] for r in rows if f"{TABLE_KEY}/path" in r] == [0, 1]
    tables = sorted(_tables(tmp_path), key=lambda t: t["data"][0][0])
    assert [len(t["data"]) for t in tables] == [2, 1]


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    cfg = load_config(None, [f"runs_dir={tmp_path}", "name=r", *WANDB])
    run_dir = tmp_path / "r"
    first = open_wandb(cfg, run_dir)
    first.finish()
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    assert first.run.id == run_id
    again = open_wandb(dataclasses.replace(cfg, resume=True), run_dir)
    again.finish()
    assert again.run.id == run_id
    # offline-run-<time>-<id>, a second one in the same second with a "-1" after the id
    assert [p.name.split("-")[3] for p in (run_dir / "wandb").glob("offline-run-*")] == [run_id, run_id]
    fresh = open_wandb(cfg, run_dir)  # not a resume (a fresh start): a new W&B run
    fresh.finish()
    assert fresh.run.id != run_id and (run_dir / RUN_ID_FILE).read_text().strip() == fresh.run.id
    assert open_wandb(load_config(None, [f"runs_dir={tmp_path}", "name=r"]), run_dir) is None  # log.wandb=false


# ----------------------------------------------------------------------------- without the package
def test_a_missing_wandb_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    argv = TINY + [f"runs_dir={tmp_path}", "name=m", "log.wandb=true"]
    for extra in ([], ["--dry-run"]):
        with pytest.raises(SystemExit) as info:
            main(argv + extra)
        msg = str(info.value)
        assert msg.startswith("config error: log.wandb=true: the wandb package is not installed"), msg
        assert "pip install 'jaxagent[wandb]'" in msg and "log.wandb=false" in msg
    assert not (tmp_path / "m").exists()
    with pytest.raises(WandbMissing, match=r"pip install 'jaxagent\[wandb\]'"):
        open_wandb(load_config(None, [f"runs_dir={tmp_path}", "name=m", "log.wandb=true"]), tmp_path / "m")
    check_wandb(load_config(None, []))  # log.wandb=false: wandb never imported
