"""It learns: the whole trainer must solve a task that needs a working world model.

On the cue task (dreamer/envs/cue.py) the reward is 1 when the action names the cue
shown, so the agent must learn reward from (observation, action) in its world model
and act on imagined returns. A random policy scores length / cues = 8.
"""

import pytest

from tests.runs import read_metrics, run_trainer


@pytest.mark.slow
def test_mean_return_rises_well_above_a_random_policy(tmp_path):
    logdir = tmp_path / "run"
    result = run_trainer(logdir, "experiment=cue")
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_metrics(logdir)
    returns = [row["episode/return"] for row in rows if "episode/return" in row]
    random_return = 16 / 2
    early = sum(returns[:2]) / 2
    late = sum(returns[-3:]) / 3
    assert early < random_return + 2, f"starts near random, got {returns}"
    assert late >= random_return + 4, f"did not learn: {returns}"
    # the periodic evaluation runs in a process of its own: it scores above a random
    # policy only if it received the learner's weights (its initial ones play randomly).
    # 16 episodes: a random policy's mean has a standard deviation of 0.5
    evals = [row["eval/return"] for row in read_metrics(logdir, "eval")]
    assert len(evals) == 2 and evals[-1] >= random_return + 2, evals
