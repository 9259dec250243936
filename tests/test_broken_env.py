"""An env that returns what its spaces do not allow: one bad step is replaced by a
recreated env and never reaches the agent; an env bad on every try ends the run with
exit 1 and one line naming the env, the key and the step, never a hung run."""

import pytest
import torch

from dreamer.envs.make import RESTART_KEY, make_env
from tests.runs import run_trainer

BAD = {
    "shape": "observation 'position' has shape (4,); its space says (3,)",
    "dtype": "observation 'position' has dtype complex64; its space says float32",
    "nan_obs": "observation 'position' holds NaN or Inf",
    "inf_reward": "the reward is inf",
    "missing": "observation 'position' is missing",
}
ID = "tests.faulty_env:BadData-v0"


def gym_env(**kwargs) -> dict:
    return {"name": "gym", "id": ID, "kwargs": kwargs, "length": 0, "reward_scale": 1.0}


@pytest.mark.parametrize("bad", BAD)
def test_one_bad_step_is_replaced_by_a_recreated_env(bad, caplog):
    env = make_env(gym_env(bad=bad, at=20), seed=0)
    rollout = env.rollout(60, break_when_any_done=False)
    env.close()
    position, reward = rollout["next", "position"], rollout["next", "reward"]
    assert position.shape == (60, 3) and torch.isfinite(position).all()
    assert torch.isfinite(reward).all()
    restarted = rollout["next", RESTART_KEY].reshape(-1).nonzero().reshape(-1).tolist()
    # each instance's bad step 20 comes back as the next instance's first observation
    assert restarted == [19, 39, 59]
    assert rollout["next", "truncated"][restarted].all()
    assert any(BAD[bad] in record.getMessage() for record in caplog.records)


def test_an_env_bad_on_every_try_raises_naming_env_key_and_step():
    env = make_env(gym_env(bad="nan_obs", at=1, forever=True), seed=0)
    env.reset()
    action = env.full_action_spec["action"].zero()
    with pytest.raises(RuntimeError) as error:
        for _ in range(10):
            env.step(env.reset().set("action", action))
    message = str(error.value)
    assert f"env {ID}: {BAD['nan_obs']} at step 1 of an episode" in message
    assert "3 times in a row" in message


@pytest.mark.slow
def test_a_run_on_an_env_bad_for_good_exits_1_in_one_line(tmp_path):
    kwargs = "env.kwargs={bad: inf_reward, at: 1, forever: true}"
    env = ["env=gym", f"env.id={ID}", "env.length=0", kwargs]
    result = run_trainer(tmp_path / "run", "experiment=smoke", *env, "run.steps=2000", timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and f"env {ID}: the reward is inf at step" in last, last
    assert f"training tiny on {ID} (update: " in result.stderr  # which gym env it runs
    assert "Traceback" not in result.stderr[-2000:]
