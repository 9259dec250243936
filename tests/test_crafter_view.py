"""The fast Crafter local view and the item view that keeps its last canvas
(``dreamer.envs.crafter_view``) against crafter's own: the same observations, canvases and
RNG state over random play (the inventory changing), walks to the world's corners and to
skeletons, at day, at night and asleep (CPU, ~15 s)."""

from __future__ import annotations

import collections
from collections.abc import Callable

import crafter
import numpy as np
import pytest
from crafter import engine

from dreamer.envs import crafter_view
from dreamer.envs.crafter import CrafterEnv, FastWorldgenEnv, OrderedWorld

ACTIONS = crafter.constants.actions
MOVES = {
    (-1, 0): ACTIONS.index("move_left"),
    (+1, 0): ACTIONS.index("move_right"),
    (0, -1): ACTIONS.index("move_up"),
    (0, +1): ACTIONS.index("move_down"),
}
SAFE_GROUND = ["grass", "sand", "path"]  # walkable, unlike lava
RANDOM_PLAY_SEEDS = (0, 1, 3)
RANDOM_PLAY_STEPS = 300
CORNERS = {  # a seed whose player can walk to that corner within WALK_STEPS
    "top left": (0, lambda x, y: x < 4 and y < 3),
    "top right": (1, lambda x, y: x >= 60 and y < 3),
    "bottom left": (5, lambda x, y: x < 4 and y >= 61),
    "bottom right": (1, lambda x, y: x >= 60 and y >= 61),
}
WALK_STEPS = 150
SKELETON_SEED = 52  # a skeleton 5 cells from where the player starts
Goal = Callable[[int, int], bool]  # whether a cell (x, y) is where the walk should lead


def _reference(seed: int) -> FastWorldgenEnv:
    """Our inner env with crafter's own LocalView (our world generation equals crafter's)."""
    env = FastWorldgenEnv(size=(64, 64), length=10000, seed=seed)
    env._world.__class__ = OrderedWorld
    return env


def _reset_pair(seed: int) -> tuple[crafter.Env, crafter.Env]:
    """``CrafterEnv``'s inner env and the reference, reset, with the same first frame."""
    ours, theirs = CrafterEnv(seed=seed)._env, _reference(seed)
    view = ours._local_view
    assert type(view) is crafter_view.LocalView and type(theirs._local_view) is engine.LocalView
    assert type(ours._item_view) is crafter_view.ItemView
    assert type(theirs._item_view) is engine.ItemView
    assert view._world is ours._world and type(ours._world) is OrderedWorld
    np.testing.assert_array_equal(view._grid, theirs._local_view._grid)
    np.testing.assert_array_equal(ours.reset(), theirs.reset(), err_msg=f"seed {seed}, reset")
    return ours, theirs


def _assert_same_rng(ours: crafter.Env, theirs: crafter.Env) -> None:
    for a, b in zip(ours._world.random.get_state(), theirs._world.random.get_state(), strict=True):
        np.testing.assert_array_equal(a, b)


def _assert_obj_map_exact(world: engine.World) -> None:
    """What the fast view relies on: each live object alone in its cell, holding its index."""
    live = {index: obj for index, obj in enumerate(world._objects) if obj}
    for index, obj in live.items():
        assert world._obj_map[tuple(obj.pos)] == index
    assert np.count_nonzero(world._obj_map) == len(live)


def _assert_same_canvas(env: crafter.Env) -> None:
    """Our LocalView's canvas against crafter's, drawn from the same world and RNG state
    (``_light`` draws noise at night), leaving that state as it was."""
    world, player, unit = env._world, env._player, env._size // env._view
    stock = engine.LocalView(world, env._textures, env._local_view._grid)
    state = world.random.get_state()
    want = stock(player, unit)
    state_after = world.random.get_state()
    world.random.set_state(state)
    got = env._local_view(player, unit)
    for a, b in zip(world.random.get_state(), state_after, strict=True):
        np.testing.assert_array_equal(a, b)
    world.random.set_state(state)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()
    _assert_obj_map_exact(world)


class Coverage(collections.Counter):
    """How many frames showed each condition the view draws differently."""

    def record(self, env: crafter.Env) -> None:
        world, player = env._world, env._player
        inventory = dict(player.inventory)
        self["inventory changes"] += inventory != self.__dict__.get("inventory", inventory)
        self.__dict__["inventory"] = inventory
        view = env._local_view
        corner = player.pos - view._offset
        self["night"] += world.daylight < 0.5
        self["sleeping"] += player.sleeping
        self["past the border"] += bool(
            (corner < 0).any() or (corner + view._grid > world.area).any()
        )
        for obj in world.objects:
            cell = obj.pos - corner
            if obj is not player and ((0 <= cell) & (cell < view._grid)).all():
                self[type(obj).__name__] += 1


def _step_both(
    ours: crafter.Env, theirs: crafter.Env, action: int, coverage: Coverage, where: str
) -> None:
    obs, reward, done, _ = ours.step(action)
    want_obs, want_reward, want_done, _ = theirs.step(action)
    np.testing.assert_array_equal(obs, want_obs, err_msg=where)
    assert (reward, done) == (want_reward, want_done), where
    coverage.record(theirs)
    if done:
        coverage["episode ends"] += 1
        np.testing.assert_array_equal(ours.reset(), theirs.reset(), err_msg=where)


def _first_move(env: crafter.Env, goal: Goal) -> int | None:
    """The first move of a shortest walk over free safe ground to a cell where ``goal`` holds."""
    world = env._world
    safe_ids = [world._mat_ids[name] for name in SAFE_GROUND]
    free = np.isin(world._mat_map, safe_ids) & (world._obj_map == 0)
    start = tuple(env._player.pos.tolist())
    first = {start: None}
    queue = collections.deque([start])
    while queue:
        cell = queue.popleft()
        if goal(*cell) and first[cell] is not None:
            return first[cell]
        for step, move in MOVES.items():
            near = (cell[0] + step[0], cell[1] + step[1])
            inside = 0 <= near[0] < world.area[0] and 0 <= near[1] < world.area[1]
            if inside and near not in first and free[near]:
                first[near] = first[cell] or move
                queue.append(near)
    return None


def _walk(seed: int, goal_in: Callable[[crafter.Env], Goal], coverage: Coverage) -> bool:
    """Walk to and about the cells ``goal_in(env)`` names at each step (random actions where
    no walk leads), comparing every frame; whether the player stood on such a cell."""
    ours, theirs = _reset_pair(seed)
    rng = np.random.default_rng(seed)
    reached = False
    for step in range(WALK_STEPS):
        goal = goal_in(theirs)
        reached |= goal(*theirs._player.pos.tolist())
        move = _first_move(theirs, goal)
        action = int(rng.integers(len(ACTIONS))) if move is None else move
        _step_both(ours, theirs, action, coverage, f"seed {seed}, step {step}")
        _assert_same_canvas(ours)
    _assert_same_rng(ours, theirs)
    return reached


def _near_a_skeleton(env: crafter.Env) -> Goal:
    skeletons = [
        tuple(obj.pos.tolist())
        for obj in env._world.objects
        if isinstance(obj, crafter.objects.Skeleton)
    ]
    return lambda x, y: any(abs(x - sx) + abs(y - sy) <= 3 for sx, sy in skeletons)


def test_random_play_draws_crafters_frames() -> None:
    coverage = Coverage()
    for seed in RANDOM_PLAY_SEEDS:
        ours, theirs = _reset_pair(seed)
        actions = np.random.default_rng(seed).integers(0, len(ACTIONS), RANDOM_PLAY_STEPS)
        for step, action in enumerate(actions.tolist()):
            _step_both(ours, theirs, action, coverage, f"seed {seed}, step {step}")
            if step % 10 == 0 or ours._player.sleeping:
                _assert_same_canvas(ours)
        _assert_same_rng(ours, theirs)
    assert coverage["night"] > 0 and coverage["sleeping"] > 0, coverage
    assert coverage["episode ends"] > 0, coverage
    assert coverage["inventory changes"] > 10, coverage  # the item view draws them anew
    assert coverage["Cow"] > 0 and coverage["Zombie"] > 0 and coverage["Plant"] > 0, coverage


@pytest.mark.parametrize("corner", CORNERS)
def test_view_past_the_worlds_corner_draws_crafters_frames(corner: str) -> None:
    seed, in_corner = CORNERS[corner]
    coverage = Coverage()
    reached = _walk(seed, lambda env: in_corner, coverage)
    assert reached, f"seed {seed} did not reach the {corner} corner"
    assert coverage["past the border"] > 0, coverage


def test_skeletons_and_arrows_in_view_draw_crafters_frames() -> None:
    coverage = Coverage()
    assert _walk(SKELETON_SEED, _near_a_skeleton, coverage)
    assert coverage["Skeleton"] > 0 and coverage["Arrow"] > 0, coverage
