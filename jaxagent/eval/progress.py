"""Live progress of an evaluation (host code): episodes done / total, success so far, ETA.

    progress = EpisodeProgress("eval before", total=64 * 4, enabled=cfg.progress)
    ... progress.done(success=True) ...            # once per finished episode
    progress.close()

On a terminal, a tqdm bar whose postfix holds the success rate so far; elsewhere (CI logs, pipes) a
line when the episodes start, one at the first episode's end, then at most one every ``every_s`` seconds, and one when the last
episode ends, so logs stay readable without carriage returns. Disabled (``progress=false``), it
shows nothing; the caller still prints its summary and where its files are.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

__all__ = ["EpisodeProgress", "heartbeat"]


class EpisodeProgress:
    """Progress of ``total`` episodes labelled ``label`` (see the module docstring)."""

    def __init__(self, label: str, total: int, *, enabled: bool = True, stream: IO[str] | None = None,
                 tty: bool | None = None, every_s: float = 10.0):
        if total < 0:
            raise ValueError(f"total={total}: expected an integer >= 0")
        self.label, self.total, self.every_s = label, total, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and total > 0
        self.tty = self.stream.isatty() if tty is None else tty
        self.n = self.wins = 0
        self.start = time.perf_counter()
        self._last: float | None = None
        self._bar: Any = None
        if self.enabled and self.tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=label, file=self.stream, dynamic_ncols=True, leave=True, unit="ep")
        elif self.enabled:  # what is coming, before the first episode ends
            print(f"[{label}] 0/{total} episodes started", file=self.stream, flush=True)

    def line(self) -> str:
        """``[label] n/total episodes, success s so far, t s elapsed, ETA e s``."""
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.n * (self.total - self.n) if self.n else float("nan")
        success = f"{self.wins / self.n:.3f}" if self.n else "-"
        return (f"[{self.label}] {self.n}/{self.total} episodes, success {success} so far, {elapsed:.0f} s elapsed, "
                f"ETA {eta:.0f} s")

    def done(self, success: bool) -> None:
        """One more episode finished (``success``: it counts as solved)."""
        self.n += 1
        self.wins += bool(success)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix({"success": f"{self.wins / self.n:.3f}"}, refresh=False)
            self._bar.update(1)
            return
        now = time.perf_counter()
        if self._last is None or now - self._last >= self.every_s or self.n == self.total:
            self._last = now
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        """Closes the bar (a terminal's); idempotent."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@contextlib.contextmanager
def heartbeat(what: str, say: Callable[[str], None], every_s: float = 10.0) -> Iterator[None]:
    """``say("<what>: still running (<t> s)")`` every ``every_s`` seconds while the ``with`` body
    runs (from a daemon thread): a long compile or rollout is never silent."""
    stop, t0 = threading.Event(), time.perf_counter()

    def beat():
        while not stop.wait(every_s):
            say(f"{what}: still running ({time.perf_counter() - t0:.0f} s)")

    th = threading.Thread(target=beat, daemon=True, name="jaxagent-heartbeat")
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()
