"""``TrainClock``: a training run's seconds, without the time it spent paused.

Why: a run's time budget and its LR schedule (``--time-limit-min``: the cosine decays over it, resumes included)
measure training. Long runs share the machine with benchmarks, and the way to lend it for a few minutes is to stop
the run (``kill -STOP``) and continue it after (``kill -CONT``). Counted in wall time, every pause ate its length
of the schedule: issue 33's run reached step 1,059 at "102.9 of 240 minutes" where 1,059 steps take ~27 minutes of
training (stop 50), so its learning rate had decayed as if four times as many steps had run.

The rule: the clock adds the wall time between consecutive ``tick`` calls, except for a gap across a pause, which
counts as the median of the recent gaps (one typical step). A gap is across a pause when SIGCONT arrived since
the previous tick (``paused``, set by the handler ``counting_pauses`` installs) or when it is longer than
``PAUSE_S`` (a suspended machine sends no signal)."""

from __future__ import annotations

import signal
import time
from collections import deque
from typing import Callable

import numpy as np

from .data import on_signal

PAUSE_S = 600.0  # a gap this long is a pause even without SIGCONT (no training step or evaluation takes 10 minutes)


class TrainClock:
    """Training seconds so far (``seconds``) and wall seconds left out (``paused_s``), resumable:
    ``TrainClock(state["train_seconds"], state["paused_seconds"])``. Tick once per training step (and once per
    evaluation), so that the recent gaps are steps."""

    def __init__(self, seconds: float = 0.0, paused_s: float = 0.0, now: Callable[[], float] = time.time,
                 pause_s: float = PAUSE_S):
        self.seconds = float(seconds)
        self.paused_s = float(paused_s)  # wall seconds left out so far
        self.paused = False  # SIGCONT since the last tick
        self._now, self._pause_s = now, float(pause_s)
        self._last = now()
        self._gaps: deque[float] = deque(maxlen=64)

    def tick(self) -> float:
        """Add the time since the previous tick (a pause counting as one typical gap); return ``seconds``."""
        t = self._now()
        gap, self._last = max(0.0, t - self._last), t
        if self.paused or gap > self._pause_s:
            typical = min(gap, float(np.median(self._gaps))) if self._gaps else 0.0
            self.paused_s += gap - typical
            gap = typical
            self.paused = False
        else:
            self._gaps.append(gap)
        self.seconds += gap
        return self.seconds


def counting_pauses(clock: TrainClock):
    """Inside the block SIGCONT marks ``clock.paused`` (``data.on_signal``: the previous handler restored after it,
    a no-op outside the main thread)."""
    def handler(signum, frame):
        clock.paused = True

    return on_signal(signal.SIGCONT, handler)


__all__ = ["PAUSE_S", "TrainClock", "counting_pauses"]
