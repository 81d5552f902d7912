"""A training run's clock leaves out the time it was stopped (train/clock.py): the LR schedule and the time budget
measure training, and a run paused with SIGSTOP for a benchmark must not find its cosine decayed on SIGCONT."""

import os
import signal

from mindspore_eagle.train.clock import TrainClock, counting_pauses


class FakeTime:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_clock_adds_wall_time_between_ticks_and_resumes_from_saved_seconds():
    now = FakeTime()
    clock = TrainClock(50.0, now=now)
    for dt in (1.0, 2.0, 1.5):
        now.t += dt
        clock.tick()
    assert clock.seconds == 54.5 and clock.paused_s == 0.0


def test_a_gap_after_sigcont_counts_as_one_typical_step():
    now = FakeTime()
    clock = TrainClock(now=now)
    for dt in (1.0, 1.2, 0.8, 1.0):  # median 1.0
        now.t += dt
        clock.tick()
    now.t += 300.0  # stopped for five minutes, then SIGCONT
    clock.paused = True
    clock.tick()
    assert clock.seconds == 5.0 and clock.paused_s == 299.0 and not clock.paused
    now.t += 1.0  # the next step counts in full again
    assert clock.tick() == 6.0


def test_a_gap_longer_than_the_pause_limit_counts_as_a_pause_without_a_signal():
    now = FakeTime()
    clock = TrainClock(now=now, pause_s=60.0)
    now.t += 2.0
    clock.tick()
    now.t += 30.0  # an evaluation: long, but training
    clock.tick()
    now.t += 3600.0  # a suspended machine
    clock.tick()
    assert clock.seconds == 2.0 + 30.0 + 16.0 and clock.paused_s == 3600.0 - 16.0  # median of (2, 30) = 16


def test_sigcont_inside_the_block_marks_the_clock_and_the_handler_is_restored():
    previous = signal.getsignal(signal.SIGCONT)
    clock = TrainClock()
    with counting_pauses(clock):
        os.kill(os.getpid(), signal.SIGCONT)
        assert clock.paused
    assert signal.getsignal(signal.SIGCONT) == previous
