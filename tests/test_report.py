"""Run reports: metrics.jsonl read back (truncated last line, resumed-run duplicates), the InfoPO
collapse diagnostics against hand-computed values, PNG plots present/absent with their data,
TensorBoard scalars read back from the event file, and the before/after table."""

import json
import math
import struct

import numpy as np
import pytest

from jaxagent.eval import report
from jaxagent.eval.report import (
    TensorBoardWriter,
    export_tensorboard,
    gain_by_turn_matrix,
    infopo_diagnostics,
    plot_run,
    read_metrics,
    summary_table,
)


def _rl(step, **kw):
    rec = {"phase": "rl", "step": step, "time": 1000.0 + step, "success": 0.5, "reward": 0.4, "turns": 3.0,
           "response_tokens": 20.0, "episode_tokens": 200.0, "update/entropy": 1.0}
    rec.update(kw)
    return rec


def _eval(step, label, success, **kw):
    return {"phase": "eval", "step": step, "time": 2000.0 + step, "label": label, "success": success,
            "reward": success, "turns": 3.0, "response_tokens": 20.0, **kw}


def _sft(step, loss):
    return {"phase": "sft", "step": step, "time": 500.0 + step, "loss": loss, "nll": loss, "grad_norm": 1.0,
            "lr": 1e-4}


# ----------------------------------------------------------------------------- read_metrics
def test_read_metrics_skips_blank_lines_and_truncated_last_line(tmp_path):
    recs = [_sft(0, 2.0), _rl(0), _eval(1, "during", 0.5)]
    text = "\n".join(json.dumps(r) for r in recs[:2]) + "\n\n  \n" + json.dumps(recs[2]) + "\n"
    path = tmp_path / "metrics.jsonl"
    path.write_text(text + json.dumps(_rl(1))[:37])  # crash mid-write
    assert read_metrics(path) == recs
    path.write_text(text + json.dumps(_rl(1)))  # complete last record without its newline: kept
    assert read_metrics(path) == recs + [_rl(1)]


def test_read_metrics_keeps_the_record_a_resumed_run_appended_to_a_partial_line(tmp_path):
    partial = json.dumps(_rl(5))[:40]
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(_rl(4)) + "\n" + partial + json.dumps(_rl(5, reward=0.9)) + "\n"
                    + json.dumps(_rl(6)) + "\n")
    assert read_metrics(path) == [_rl(4), _rl(5, reward=0.9), _rl(6)]
    path.write_text(json.dumps(_rl(4)) + "\n" + "garbage{\n" + json.dumps(_rl(6)) + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(path)


# ----------------------------------------------------------------------------- diagnostics
def test_diagnostics_eval_drop_collapses():
    m = [_eval(0, "before", 0.9),  # not counted: only during/after evaluations
         _rl(0, turns=2.0, response_tokens=10.0, **{"update/entropy": 1.0}),
         _rl(1, turns=4.0, response_tokens=30.0, **{"update/entropy": 0.5}),
         _eval(2, "during", 0.1), _eval(4, "during", 0.8), _eval(6, "after", 0.5)]
    d = infopo_diagnostics(m)
    assert d["best_success"] == 0.8 and d["final_success"] == 0.5
    assert d["best_to_final_drop"] == pytest.approx(0.3)
    assert d["collapse"] is True and len(d["collapse_reasons"]) == 1 and "eval" in d["collapse_reasons"][0]
    assert d["avg_turns"] == 3.0 and d["avg_response_tokens"] == 20.0
    assert d["entropy_ratio"] == 0.5
    assert d["length_reward_corr"] == 0.0  # two RL points


@pytest.mark.parametrize("final_entropy, collapse", [(0.04, True), (0.06, False)])
def test_diagnostics_entropy_collapse(final_entropy, collapse):
    m = [_rl(0, **{"update/entropy": 1.0}), _rl(1, **{"update/entropy": 0.5}),
         _rl(2, **{"update/entropy": final_entropy}),
         _eval(1, "during", 0.2), _eval(2, "during", 0.4), _eval(3, "after", 0.6)]
    d = infopo_diagnostics(m)
    assert (d["best_success"], d["final_success"], d["best_to_final_drop"]) == (0.6, 0.6, 0.0)
    assert d["entropy_ratio"] == pytest.approx(final_entropy)
    assert d["collapse"] is collapse


def test_diagnostics_drop_of_exactly_the_threshold_collapses_despite_rounding():
    assert 0.6 - 0.4 < 0.2  # float rounding
    d = infopo_diagnostics([_eval(1, "during", 0.6), _eval(2, "after", 0.4)])
    assert d["collapse"] is True
    d = infopo_diagnostics([_eval(1, "during", 0.6), _eval(2, "after", 0.45)])
    assert d["collapse"] is False


def test_diagnostics_without_data():
    d = infopo_diagnostics([_sft(0, 1.0)])
    assert d["final_success"] is None and d["best_success"] is None and d["best_to_final_drop"] is None
    assert d["avg_turns"] is None and d["avg_response_tokens"] is None and d["entropy_ratio"] is None
    assert d["collapse"] is False and d["length_reward_corr"] == 0.0


def test_length_reward_correlation_matches_numpy():
    tokens = [10.0, 14.0, 9.0, 30.0, 22.0]
    rewards = [0.1, 0.5, 0.2, 0.3, 0.9]
    d = infopo_diagnostics([_rl(i, response_tokens=t, reward=r) for i, (t, r) in enumerate(zip(tokens, rewards))])
    assert d["length_reward_corr"] == pytest.approx(np.corrcoef(tokens, rewards)[0, 1], abs=1e-12)
    assert d["length_reward_corr"] != 0.0
    # perfectly anti-correlated; a constant series or fewer than three points give 0
    anti = infopo_diagnostics([_rl(i, response_tokens=float(i), reward=-2.0 * i) for i in range(4)])
    assert anti["length_reward_corr"] == pytest.approx(-1.0)
    const = infopo_diagnostics([_rl(i, response_tokens=float(i), reward=0.1) for i in range(4)])
    assert const["length_reward_corr"] == 0.0
    const = infopo_diagnostics([_rl(i, response_tokens=12.0, reward=float(i)) for i in range(4)])
    assert const["length_reward_corr"] == 0.0
    two = infopo_diagnostics([_rl(i, response_tokens=float(i), reward=float(i)) for i in range(2)])
    assert two["length_reward_corr"] == 0.0


def test_resumed_run_duplicates_keep_the_last_record():
    # iterations 1-2 re-run after a resume: the second copies are the ones the run continued from
    m = [_rl(0, turns=1.0), _rl(1, turns=100.0), _rl(2, turns=100.0), _eval(2, "during", 0.9),
         _rl(1, turns=2.0), _rl(2, turns=3.0), _eval(2, "during", 0.3), _eval(3, "after", 0.3)]
    d = infopo_diagnostics(m)
    assert d["avg_turns"] == 2.0
    assert d["best_success"] == 0.3 and d["collapse"] is False


# ----------------------------------------------------------------------------- plots
def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _full_run():
    m = [_eval(0, "before", 0.1)] + [_sft(i, 2.0 / (i + 1)) for i in range(0, 30, 10)]
    for i in range(6):
        gains = [0.3 - 0.05 * i, -0.1 + 0.02 * i, None if i % 2 else 0.05][: 2 + (i % 2 == 0)]
        m.append(_rl(i, success=0.1 * i, reward=0.1 * i - 0.05, turns=3.0 - 0.2 * i,
                     response_tokens=20.0 + i, **{"info/gain_by_turn": gains}))
    m += [_eval(3, "during", 0.4), _eval(6, "after", 0.6)]
    return m


def test_plot_run_writes_valid_pngs(tmp_path):
    out = tmp_path / "plots"
    paths = plot_run(_full_run(), out)
    names = ["reward.png", "turns_length.png", "infogain_heatmap.png", "sft_loss.png", "rl_diagnostics.png"]
    assert [p.name for p in paths] == names
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    for p in paths:
        w, h = _png_size(p)
        assert 400 <= w <= 2000 and 300 <= h <= 2000, (p.name, w, h)


def test_plot_run_skips_absent_data(tmp_path):
    assert plot_run([_sft(0, 1.0), _sft(10, 0.5)], tmp_path / "a") == [tmp_path / "a" / "sft_loss.png"]
    assert [p.name for p in plot_run([_rl(0), _rl(1), _eval(2, "after", 0.5)], tmp_path / "b")] == [
        "reward.png", "turns_length.png", "rl_diagnostics.png"]  # no info/gain_by_turn, no SFT
    assert not (tmp_path / "b" / "infogain_heatmap.png").exists()
    assert plot_run([_eval(0, "before", 0.5)], tmp_path / "c") == []
    assert not (tmp_path / "c").exists()


def _integer_ticks(axis):
    ticks = axis.get_majorticklocs()
    return len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


def _labelled(ax, label):
    return [a for a in (*ax.lines, *ax.patches, *ax.collections) if a.get_label() == label]


def test_reward_figure_marks_where_sft_ends_and_rl_starts():
    fig = report.reward_figure(_full_run())
    (ax,) = fig.axes
    (line,) = _labelled(ax, "RL starts (after SFT)")
    assert list(line.get_xdata()) == [0.0, 0.0] and line.get_linestyle() == "--"
    (span,) = _labelled(ax, "SFT (between the first eval and RL)")
    x0, x1 = span.get_x(), span.get_x() + span.get_width()
    assert (x0, x1) == (-1.0, 0.0)
    (points,) = _labelled(ax, "eval success")
    assert points.get_offsets().tolist() == [[-1.0, 0.1], [3.0, 0.4], [6.0, 0.6]]   # before, during, after
    assert any(t.get_text().startswith("before (pre-SFT) 0.10") for t in ax.texts)
    fig.canvas.draw()
    labels = {t.get_text() for t in ax.get_xticklabels()}
    assert "pre-SFT" in labels and "-1" not in labels and _integer_ticks(ax.xaxis)
    # without SFT nothing is marked and the first evaluation sits at iteration 0
    no_sft = [r for r in _full_run() if r["phase"] != "sft"]
    (ax,) = report.reward_figure(no_sft).axes
    assert not _labelled(ax, "RL starts (after SFT)") and not _labelled(ax, "SFT (between the first eval and RL)")
    assert _labelled(ax, "eval success")[0].get_offsets().tolist()[0] == [0.0, 0.1]


@pytest.mark.parametrize("rates", [(0.50, 0.51, 0.53), (0.96, 0.97, 0.99), (0.0, 0.01, 0.03)])
def test_reward_axis_is_the_whole_rate_scale(rates):
    m = [_rl(i, success=r, reward=r) for i, r in enumerate(rates)] + [_eval(3, "after", rates[-1])]
    (ax,) = report.reward_figure(m).axes
    lo, hi = ax.get_ylim()
    assert lo <= 0.0 and hi >= 1.0 and hi - lo < 1.3       # a 3% change spans 3% of the axis
    assert _integer_ticks(ax.xaxis)
    # a reward outside [0, 1] widens the axis instead of being cut off
    (ax,) = report.reward_figure([_rl(0, reward=-0.5), _rl(1, reward=2.0)]).axes
    lo, hi = ax.get_ylim()
    assert lo <= -0.5 and hi >= 2.0


def test_turns_tokens_and_loss_axes_start_at_zero_with_integer_ticks():
    m = [_rl(i, turns=10.0 + 0.1 * i, response_tokens=200.0 + i) for i in range(4)] + [_sft(i, 2.0 - 0.01 * i)
                                                                                          for i in range(3)]
    ax1, ax2 = report.turns_length_figure(m).axes
    for ax, top in ((ax1, 10.3), (ax2, 203.0)):
        lo, hi = ax.get_ylim()
        assert lo == 0.0 and top <= hi <= 1.3 * top and _integer_ticks(ax.xaxis)
    (ax,) = report.sft_loss_figure(m).axes
    lo, hi = ax.get_ylim()
    assert lo == 0.0 and 2.0 <= hi <= 2.6 and _integer_ticks(ax.xaxis)


def test_infogain_heatmap_explains_its_grey_cells():
    fig = report.infogain_figure(_full_run())
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == [report.GREY_CELLS_NOTE] and texts[0].startswith("grey: no valid turn at this index")
    assert _integer_ticks(ax.xaxis)
    full = [_rl(i, **{"info/gain_by_turn": [0.1, 0.2]}) for i in range(3)]   # no grey cell: no note
    assert report.infogain_figure(full).axes[0].get_legend() is None
    assert report.infogain_figure([_rl(0)]) is None and report.reward_figure([_sft(0, 1.0)]) is None


def test_gain_by_turn_matrix_nan_where_no_value():
    m = [_rl(2, **{"info/gain_by_turn": [0.5, None]}), _rl(3),  # no gains logged at step 3
         _rl(4, **{"info/gain_by_turn": [0.25, -0.5, 1.0]}), _rl(5, **{"info/gain_by_turn": [float("nan")]})]
    steps, grid = gain_by_turn_matrix(m)
    assert steps.tolist() == [2, 3, 4, 5]
    expect = np.array([[0.5, np.nan, 0.25, np.nan],
                       [np.nan, np.nan, -0.5, np.nan],
                       [np.nan, np.nan, 1.0, np.nan]])
    np.testing.assert_array_equal(grid, expect)
    steps, grid = gain_by_turn_matrix([_rl(0)])
    assert steps.size == 0 and grid.size == 0


# ----------------------------------------------------------------------------- TensorBoard
def _read_scalars(log_dir):
    """{(tag, step): value} from the event files under log_dir (TFRecord: len u64, crc u32, data, crc u32)."""
    from tensorboardX.proto import event_pb2

    out, walltimes = {}, {}
    files = sorted(log_dir.rglob("events.out.tfevents.*"))
    assert files
    for f in files:
        data, pos = f.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos: pos + 8])
            ev = event_pb2.Event.FromString(data[pos + 12: pos + 12 + n])
            pos += 12 + n + 4
            for v in ev.summary.value:
                out[(v.tag, ev.step)] = v.simple_value
                walltimes[(v.tag, ev.step)] = ev.wall_time
    return out, walltimes


def test_tensorboard_scalars_read_back(tmp_path):
    with TensorBoardWriter(tmp_path / "tb") as tb:
        n = tb.scalars(3, {"success": 0.25, "turns": 4, "update/kl_ref": 0.125, "nan": float("nan"),
                           "inf": float("inf"), "info/gain_by_turn": [0.1, None], "label": "after",
                           "none": None, "step": 3, "time": 1234.5}, prefix="rl")
        n += tb.scalars(7, {"success": 0.75}, prefix="rl")
    assert n == 4
    scalars, _ = _read_scalars(tmp_path / "tb")
    assert scalars == {("rl/success", 3): 0.25, ("rl/turns", 3): 4.0, ("rl/update/kl_ref", 3): 0.125,
                       ("rl/success", 7): 0.75}


def test_export_tensorboard_prefixes_by_phase(tmp_path):
    m = [_sft(0, 2.0), _rl(0, reward=0.5), _eval(1, "during", 0.25)]
    n = export_tensorboard(m, tmp_path / "tb")
    scalars, walltimes = _read_scalars(tmp_path / "tb")
    assert n == len(scalars) == 4 + 6 + 4  # sft: loss nll grad_norm lr; rl: 6 numbers; eval: 4
    assert scalars[("sft/loss", 0)] == 2.0 and scalars[("rl/reward", 0)] == 0.5
    assert scalars[("eval/success", 1)] == 0.25 and ("eval/label", 1) not in scalars
    assert walltimes[("rl/reward", 0)] == 1000.0
    assert not any(tag.endswith(("/time", "/step", "/phase")) for tag, _ in scalars)


# ----------------------------------------------------------------------------- table and CLI
def test_summary_table_rows():
    table = summary_table({"success": 0.1, "reward": 0.2, "turns": 5.0, "response_tokens": 120.0},
                          {"success": 0.6, "reward": 0.15, "turns": 3.5})
    lines = table.splitlines()
    assert len(lines) == 6
    cells = [[c.strip() for c in line.split("|")] for line in lines]
    assert cells[0] == ["metric", "before", "after", "change"]
    assert set(lines[1]) <= {"-", "+"}
    assert cells[2] == ["success", "0.100", "0.600", "+0.500"]
    assert cells[3] == ["reward", "0.200", "0.150", "-0.050"]
    assert cells[4] == ["turns", "5.000", "3.500", "-1.500"]
    assert cells[5] == ["response_tokens", "120.0", "-", "-"]
    assert len({line.index("|") for line in lines if "|" in line}) == 1  # fixed width
    custom = summary_table({"x": 1}, {"x": 3}, keys=("x",))
    assert custom.splitlines()[2].split("|")[-1].strip() == "+2.000"


def test_cli_writes_plots_and_prints_diagnostics(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                               [_eval(0, "before", 0.1), _rl(0), _rl(1), _eval(2, "after", 0.6)]))
    assert report.main([str(run), "--tensorboard"]) == 0
    out = capsys.readouterr().out
    assert "reward.png" in out and "success " in out and "+0.500" in out
    assert json.loads(out[out.index("{"):])["final_success"] == 0.6
    assert (run / "plots" / "turns_length.png").exists() and list((run / "tb").rglob("events.out.tfevents.*"))
    assert math.isfinite(_png_size(run / "plots" / "reward.png")[0])


def test_sft_loss_draws_one_line_when_loss_is_the_nll_and_two_when_they_differ():
    same = [_sft(i, 2.0 - 0.1 * i) for i in range(5)]
    (ax,) = report.sft_loss_figure(same).axes
    assert [ln.get_label() for ln in ax.lines] == ["loss (= NLL)"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["loss (= NLL)"]
    # float32 rounding between two reductions of the same mean is still one curve
    rounded = [dict(r, nll=r["nll"] * (1 + 3e-7)) for r in same]
    assert len(report.sft_loss_figure(rounded).axes[0].lines) == 1
    # a real difference (another aggregation, row weights) draws both
    differ = [dict(r, loss=r["loss"] + 0.01) for r in same]
    (ax,) = report.sft_loss_figure(differ).axes
    assert [ln.get_label() for ln in ax.lines] == ["loss", "NLL (token mean)"]
    # logged at different steps: not the same curve
    gap = [dict(r, nll=None) if r["step"] == 2 else r for r in same]
    assert len(report.sft_loss_figure(gap).axes[0].lines) == 2
    # only one of them logged: that one
    (ax,) = report.sft_loss_figure([{k: v for k, v in r.items() if k != "nll"} for r in same]).axes
    assert [ln.get_label() for ln in ax.lines] == ["loss"]


def test_loss_equals_nll_threshold():
    x = np.array([5.0, 1.0, np.nan])
    assert report.loss_equals_nll(x, x.copy())
    assert report.loss_equals_nll(x, x + 4e-5)              # 4e-5 <= 1e-5 * max(1, 5)
    assert not report.loss_equals_nll(x, x + 6e-5)
    assert not report.loss_equals_nll(np.full(3, np.nan), np.full(3, np.nan))
