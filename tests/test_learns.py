"""It learns: the whole trainer must solve a task that needs a working world model.

On the cue task (dreamer/envs/cue.py) the reward is 1 when the action names the cue
shown, so the agent must learn reward from (observation, action) in its world model
and act on imagined returns. A random policy scores length / cues = 8.
"""

import json
import subprocess
import sys


def test_mean_return_rises_well_above_a_random_policy(tmp_path):
    logdir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "dreamer.train",
        "experiment=cue",
        f"run.logdir={logdir}",
        "run.progress=false",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    returns = [row["episode/return"] for row in rows if "episode/return" in row]
    random_return = 16 / 2
    early = sum(returns[:2]) / 2
    late = sum(returns[-3:]) / 3
    assert early < random_return + 2, f"starts near random, got {returns}"
    assert late >= random_return + 4, f"did not learn: {returns}"
