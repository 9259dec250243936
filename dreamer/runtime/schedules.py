"""When the training loop does what: small objects the loop asks once per iteration."""

from __future__ import annotations

from torchrl.trainers.algorithms import DreamerV3UpdateRatio


class Clock:
    """True once per ``period`` of a growing value (env steps, seconds, updates); the
    first time at ``start + period``. Several periods passed at once count once."""

    def __init__(self, period: float, start: float = 0):
        self.period = period
        self.next = start + period

    @classmethod
    def aligned(cls, period: int, value: int) -> Clock:
        """Due at the next multiple of ``period`` after ``value`` (a resumed run logs
        and evaluates at the same steps as an uninterrupted one)."""
        return cls(period, value - value % period)

    def __call__(self, value: float) -> bool:
        if value < self.next:
            return False
        while self.next <= value:
            self.next += self.period
        return True


class TrainRatio:
    """Learner updates due at ``env_steps``: ``run.train_ratio`` replayed steps per env
    step once ``run.train_starts`` steps are in and every rank's replay can be sampled;
    ``replay.batch`` is the whole job's, so it reads the same at any world size."""

    def __init__(self, train_ratio: float, batch: int, length: int, starts: int):
        self.ratio = DreamerV3UpdateRatio(train_ratio / (batch * length))
        self.starts = starts

    def __call__(self, env_steps: int, ready: bool) -> int:
        if env_steps < self.starts or not ready:
            return 0
        return self.ratio(env_steps)

    def left(self, steps: int) -> float:
        """Updates the schedule will still give up to env step ``steps``: counted from
        its first update's step (the first batch past ``train_starts``) once there is one."""
        state = self.ratio.state_dict()
        counted_from = state["previous"]
        if counted_from is None:
            return max(steps - self.starts, 0) * state["ratio"] + 1
        return max(steps - counted_from, 0) * state["ratio"]

    def state_dict(self) -> dict:
        return self.ratio.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.ratio.load_state_dict(state)
