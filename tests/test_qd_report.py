"""Q&D report plots and printed table from hand-built summaries: the frontier's cap labels do not
overlap, coverage by depth has integer ticks at the depths and a legend entry only for what is
drawn, and the table names its two tests and the unit of the deepest need."""

import math

import pytest

from jaxagent.eval import qd_report


def _arm(questioner, frontier, depth):
    return {"questioner": questioner, "frontier": [{"cap": c, "calls": x, "coverage": y} for c, x, y in frontier],
            "coverage_by_depth": {str(d): {"coverage": v, "needs": n} for d, (v, n) in depth.items()},
            "coverage": 0.5, "deepest": 0.92, "stop": {}}


def _summary(**arms):
    return {"benchmark": "musique", "tasks": 100, "seeds": [0, 1], "drafter": "extractive", "answerer": "extractive",
            "depth_rule": "longest", "arms": arms}


# the musique run's shape (configs/qd_eval_musique.yaml): the never-ask arm reaches every cap at
# (0 calls, 0 coverage), the scripted arm was cut by its budget
MUSIQUE = _summary(
    treatment=_arm("scripted", [(4, 4.0, 0.777), (8, 5.81, 0.788)],
                   {0: (0.895, 105), 1: (0.69, 100), 2: (0.552, 29), 3: (1.0, 3)}),
    baseline=_arm("never_ask", [(c, 0.0, 0.0) for c in (4, 8, 12, 16, 24)],
                  {0: (0.0, 105), 1: (0.0, 100), 2: (0.0, 29), 3: (0.0, 3)}))


def _label_boxes(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    (ax,) = fig.axes
    return [t.get_window_extent(r) for t in ax.texts]


@pytest.mark.parametrize("summary", [
    MUSIQUE,
    # two arms through the same points, and one arm reaching caps 8-24 at the same point
    _summary(treatment=_arm("scripted", [(4, 3.9, 0.70), (8, 5.2, 0.78), (12, 5.2, 0.78), (16, 5.2, 0.78)], {}),
             baseline=_arm("scripted", [(4, 3.9, 0.70), (8, 5.2, 0.78)], {})),
])
def test_frontier_cap_labels_do_not_overlap(summary):
    fig = qd_report.frontier_figure(summary)
    (ax,) = fig.axes
    boxes = _label_boxes(fig)
    assert len(boxes) == len(ax.texts) >= 2
    for i, a in enumerate(boxes):
        assert not any(a.overlaps(b) for b in boxes[i + 1:]), [t.get_text() for t in ax.texts]
    # and every label sits inside the figure
    fb = fig.bbox
    assert all(fb.x0 <= b.x0 and b.x1 <= fb.x1 + 1 and fb.y0 <= b.y0 and b.y1 <= fb.y1 for b in boxes)


def test_frontier_caps_at_one_point_share_a_label():
    texts = [t.get_text() for t in qd_report.frontier_figure(MUSIQUE).axes[0].texts]
    assert sorted(texts) == ["cap 4", "cap 8", "caps 4, 8, 12, 16, 24"]


def test_coverage_by_depth_ticks_are_the_integer_depths():
    (ax,) = qd_report.depth_figure(MUSIQUE).axes
    assert list(ax.get_xticks()) == [0, 1, 2, 3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0\nn=105", "1\nn=100", "2\nn=29", "3\nn=3"]
    assert "hops" in ax.get_xlabel()
    # each arm's bars sit within half a unit of their depth (grouped about it)
    for bars in ax.containers:
        for d, patch in zip(range(4), bars.patches):
            assert abs(patch.get_x() + patch.get_width() / 2 - d) < 0.5


def test_coverage_by_depth_legend_has_only_what_is_drawn():
    (ax,) = qd_report.depth_figure(MUSIQUE).axes
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["treatment: scripted", "baseline: never_ask (0 at every depth)"]
    # the all-zero arm is drawn: a visible line at 0 for each depth, in its bars' colour
    (zeros,) = ax.collections
    assert len(zeros.get_segments()) == 4 and zeros.get_linewidth()[0] >= 2
    # an arm with no need of any depth gets no bar and no legend entry
    s = _summary(treatment=MUSIQUE["arms"]["treatment"], baseline=_arm("never_ask", [], {}),
                 other=_arm("x", [], {0: (math.nan, 0)}))
    (ax,) = qd_report.depth_figure(s).axes
    assert ax.get_legend_handles_labels()[1] == ["treatment: scripted"]


def _comparison(p, decided):
    cell = {"mean_diff": 0.05, "interval": [0.001, 0.1], "decided": decided, "p": p, "mde": 0.04, "n_tasks": 100}
    return {"equal_spend": {"deepest": dict(cell)}, "own_stop": {"answer_f1": dict(cell)}}


def test_the_table_names_its_two_tests_and_the_deepest_unit():
    s = dict(MUSIQUE, comparison=_comparison(0.063, True))
    text = qd_report.summary_table(s)
    assert "decided=" not in text and "decided=True p=" not in text
    assert "deepest need (hops)" in text and "in edges from a seed need" in text
    (row,) = [ln for ln in text.splitlines() if "own_stop answer_f1" in ln]
    assert "BCa CI excl. 0: yes" in row and "sign-flip p=0.063" in row and "+0.050 [+0.001, +0.100]" in row
    assert "two separate tests, which can disagree" in text
    (row,) = [ln for ln in text.splitlines() if "equal_spend deepest" in ln]
    assert "deepest (hops)" in row
    text = qd_report.summary_table(dict(MUSIQUE, comparison=_comparison(1e-4, False)))
    assert "BCa CI excl. 0: no" in text and "sign-flip p<0.001" in text
