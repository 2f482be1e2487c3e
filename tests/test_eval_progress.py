"""Evaluations are never silent: `EpisodeProgress` lines (episodes done / total, success so far, ETA),
a bar on a terminal, nothing with progress=false; a host evaluation (tau2's oracle) shows them."""

import io
import json
import subprocess
import sys

from jaxagent.eval.progress import EpisodeProgress, heartbeat


def test_lines_off_a_terminal_at_the_first_episode_at_most_every_interval_and_at_the_end():
    out = io.StringIO()
    p = EpisodeProgress("eval before", 4, stream=out, tty=False, every_s=3600.0)
    for ok in (True, False, True, True):
        p.done(ok)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3   # the start, the first episode, then the last (the interval never elapsed)
    assert lines[0] == "[eval before] 0/4 episodes started"
    assert lines[1].startswith("[eval before] 1/4 episodes, success 1.000 so far, ")
    assert lines[2].startswith("[eval before] 4/4 episodes, success 0.750 so far, ") and "ETA 0 s" in lines[2]


def test_disabled_it_shows_nothing_but_still_counts():
    out = io.StringIO()
    p = EpisodeProgress("eval", 2, enabled=False, stream=out, tty=False)
    p.done(True)
    p.done(False)
    assert out.getvalue() == "" and (p.n, p.wins) == (2, 1)


def test_on_a_terminal_a_bar_with_the_success_so_far():
    out = io.StringIO()
    p = EpisodeProgress("eval after", 3, stream=out, tty=True)
    for ok in (True, True, False):
        p.done(ok)
    p.close()
    text = out.getvalue()
    assert "eval after" in text and "3/3" in text and "success=0.667" in text


def test_a_host_evaluation_shows_progress_and_ends_saying_where_its_files_are(tmp_path):
    out = subprocess.run([sys.executable, "-m", "jaxagent.launch", "job=eval", "env=tau2", "env.tau2.domain=telecom",
                          "agent=oracle", "env.tau2.tasks=0:3", "eval.k=1", f"runs_dir={tmp_path}"],
                         capture_output=True, text=True, timeout=600, check=True)
    assert "[eval oracle] 1/3 episodes, success 1.000 so far" in out.stderr
    assert "[eval oracle] 3/3 episodes, success 1.000 so far" in out.stderr
    summary = json.loads(out.stdout[out.stdout.index("{"):])
    assert summary["files"]["summary.json"] == str(tmp_path / "eval-tau2_telecom" / "summary.json")
    # the first line says what runs and where; the last, where the results are
    lines = out.stderr.strip().splitlines()
    assert lines[0] == (f"[launch] job=eval env.kind=tau2 writes {tmp_path / 'eval-tau2_telecom'}/; building the model "
                        "and environment")
    assert lines[-1].startswith(f"[launch] results in {tmp_path / 'eval-tau2_telecom'}/")


def test_heartbeat_says_it_is_still_running_until_the_body_ends():
    import threading

    lines, started = [], threading.Event()

    def say(m):
        lines.append(m)
        started.set()

    with heartbeat("compiling", say, every_s=0.01):
        assert started.wait(10)  # at least one beat while the body runs
    n = len(lines)
    assert lines[0].startswith("compiling: still running (") and lines[0].endswith(" s)")
    threading.Event().wait(0.05)
    assert len(lines) == n  # none after the body ended
