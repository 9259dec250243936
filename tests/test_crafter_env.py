"""Tests for the gymnasium Crafter adapter (CPU, a few seconds)."""

from __future__ import annotations

import crafter
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from dreamer.envs.crafter import ACHIEVEMENTS, ACTIONS, CrafterEnv

NOOP, MOVE_RIGHT, DO = ACTIONS.index("noop"), ACTIONS.index("move_right"), ACTIONS.index("do")


def _set_material(env: CrafterEnv, offset: tuple[int, int], material: str) -> None:
    """Set the real world tile at player.pos + offset, removing any creature standing there."""
    world, player = env._env._world, env._env._player
    pos = player.pos + np.array(offset)
    obj = world[pos][1]
    if obj is not None:
        world.remove(obj)
    world[pos] = material


def _rollout(env: CrafterEnv, seed: int, actions: np.ndarray) -> tuple[list, list]:
    obs, _ = env.reset(seed=seed)
    observations, rewards = [obs], []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(int(action))
        observations.append(obs)
        rewards.append(reward)
        assert not (terminated or truncated)
    return observations, rewards


def test_check_env() -> None:
    env = CrafterEnv(seed=0)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (64, 64, 3)
    assert env.action_space.n == 17


def test_observation_is_fresh_contiguous_uint8() -> None:
    env = CrafterEnv(size=32, seed=0)
    first, _ = env.reset()
    kept = first.copy()
    assert first.shape == (32, 32, 3) and first.dtype == np.uint8
    assert first.flags["C_CONTIGUOUS"] and first.flags["OWNDATA"]
    for _ in range(5):
        obs, *_ = env.step(MOVE_RIGHT)
        assert obs.shape == (32, 32, 3) and obs.flags["C_CONTIGUOUS"]
        assert not np.shares_memory(obs, first)
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_array_equal(env.render(), obs)


def test_seeded_resets_are_reproducible() -> None:
    actions = np.random.default_rng(0).integers(0, 17, size=50)
    obs_a, rew_a = _rollout(CrafterEnv(seed=123), seed=7, actions=actions)
    obs_b, rew_b = _rollout(CrafterEnv(seed=456), seed=7, actions=actions)
    for a, b in zip(obs_a, obs_b, strict=True):
        assert a.tobytes() == b.tobytes()
    assert rew_a == rew_b
    other, _ = CrafterEnv().reset(seed=8)
    assert other.tobytes() != obs_a[0].tobytes()


def test_seed_matches_crafter_and_unseeded_resets_advance() -> None:
    env = CrafterEnv(seed=3)
    first, _ = env.reset()
    second, _ = env.reset()
    assert first.tobytes() != second.tobytes()
    # Same world sequence as the original package with the same seed.
    raw = crafter.Env(seed=3)
    np.testing.assert_array_equal(first, raw.reset())
    np.testing.assert_array_equal(second, raw.reset())


def test_death_is_terminated() -> None:
    # Not a mock: we edit the real world map so a lava tile lies to the player's right and then
    # walk into it; Crafter's own Player._move sets health to 0 on lava, and Env.step reports
    # discount 0 and done from that.
    env = CrafterEnv(seed=0)
    env.reset()
    _set_material(env, (1, 0), "lava")
    _, _, terminated, truncated, info = env.step(MOVE_RIGHT)
    assert env._env._player.health == 0
    assert info["discount"] == 0.0
    assert terminated is True and truncated is False


def test_length_limit_is_truncated() -> None:
    env = CrafterEnv(length=20, seed=0)
    env.reset()
    for t in range(1, 21):
        _, _, terminated, truncated, info = env.step(NOOP)
        assert terminated is False
        assert truncated is (t == 20)
        assert info["discount"] == 1.0


def test_info_is_a_copy_and_reports_unlocks() -> None:
    env = CrafterEnv(seed=0)
    _, info0 = env.reset()
    assert set(info0) >= {"achievements", "inventory", "discount", "achievements_unlocked"}
    assert "semantic" not in info0
    # The player faces down after reset; a tree there yields wood on "do" (real game rule).
    _set_material(env, (0, 1), "tree")
    _, reward, _, _, info = env.step(DO)
    assert info["achievements_unlocked"] == ("collect_wood",)
    assert info["achievements"]["collect_wood"] == 1 and info["inventory"]["wood"] == 1
    assert reward >= 1.0
    info["achievements"]["collect_wood"] = 99
    info["inventory"]["wood"] = 99
    _set_material(env, (0, 1), "tree")
    _, _, _, _, info2 = env.step(DO)
    assert info2["achievements"]["collect_wood"] == 2 and info2["inventory"]["wood"] == 2
    assert info2["achievements_unlocked"] == ()
    assert env._env._player.achievements["collect_wood"] == 2


def test_info_holds_every_achievement_the_score_counts() -> None:
    """The Crafter score and the achievement figures read these 22 names from info."""
    env = CrafterEnv(seed=0)
    _, info = env.reset()
    assert set(info["achievements"]) == set(ACHIEVEMENTS)
    _set_material(env, (0, 1), "tree")
    _, _, _, _, info = env.step(DO)
    assert set(info["achievements"]) == set(ACHIEVEMENTS)
    assert [name for name in ACHIEVEMENTS if info["achievements"][name]] == ["collect_wood"]


def test_step_before_reset_raises() -> None:
    with pytest.raises(RuntimeError):
        CrafterEnv(seed=0).step(NOOP)


def test_a_runs_env_makes_its_first_world_at_the_collectors_reset_from_its_seed(monkeypatch):
    """The trainer's env (``make_env``) is seeded by its construction: building it makes
    no world (a seeding reset made one, ~0.16 s, that the collector's own reset threw
    away: in the driver's probe and in every env worker); its first reset makes the
    seed's world, the same for the same seed and another for another."""
    from omegaconf import OmegaConf

    from dreamer.command_line import load
    from dreamer.envs import crafter_worldgen
    from dreamer.envs.make import make_env

    worlds = []
    generate = crafter_worldgen.generate_world
    monkeypatch.setattr(
        crafter_worldgen, "generate_world", lambda *a: worlds.append(a) or generate(*a)
    )
    env = OmegaConf.to_container(load(["env=crafter"], check=False).env)

    def first_image(seed: int) -> bytes:
        made = make_env(env, seed=seed)
        assert worlds == []  # no world made yet
        image = made.reset()["pixels"].numpy().tobytes()
        assert len(worlds) == 1
        worlds.clear()
        return image

    assert first_image(5) == first_image(5) != first_image(6)


def test_one_seed_plays_the_same_episode_in_every_env_object():
    """Crafter picks the creature it despawns by index into a set of a chunk's objects,
    which iterates in memory-address order: three env objects of one seed, fed the same
    actions, went three ways (the tests' Crafter batch, and so their losses, changed
    from run to run). Its chunks keep their objects in the order they came."""
    from omegaconf import OmegaConf

    from dreamer.command_line import load
    from dreamer.envs.make import make_env

    env = OmegaConf.to_container(load(["env=crafter"], check=False).env)
    played = []
    for _ in range(3):
        made = make_env(env, seed=0)
        torch.manual_seed(0)
        played.append(made.rollout(200, break_when_any_done=False)["next", "pixels"])
    assert all(torch.equal(played[0], other) for other in played[1:])
