"""The vectorized Crafter world generation (``dreamer.envs.crafter_worldgen``) against
crafter's own: the same noise bit for bit, the same worlds, the same RNG state, the same
episodes (CPU, ~15 s: crafter's own reset takes ~0.4 s)."""

from __future__ import annotations

import itertools

import crafter
import numpy as np
import opensimplex
import pytest
from crafter import worldgen

from dreamer.envs import crafter_worldgen
from dreamer.envs.crafter import CrafterEnv, FastWorldgenEnv, OrderedWorld

NOISE_SEEDS = (0, 1, 987654321)
ENV_SEEDS = (0, 1, 2, 3, 5, 8, 13, 12345)
STEPS = 30


def _scalar_noise(simplex: opensimplex.OpenSimplex, points) -> np.ndarray:
    return np.array([simplex.noise3d(x, y, z) for x, y, z in points])


def _vector_noise(simplex: opensimplex.OpenSimplex, points) -> np.ndarray:
    x, y, z = np.array(points, np.float64).T
    return crafter_worldgen.noise3(*crafter_worldgen.permutation(simplex), x, y, z)


def _crafter_points(form: str, z: int, size: int) -> list[tuple[float, float, int]]:
    """The points crafter's ``_simplex(x, y, z, size)`` passes to ``noise3d``, made the way
    it makes them (Python ints and floats), over its 64x64 grid."""
    arguments = {
        "plain": lambda x, y: (x, y),
        "horizontal": lambda x, y: (2 * x, y / 5),
        "vertical": lambda x, y: (x / 5, 2 * y),
    }[form]
    points = []
    for x in range(64):
        for y in range(64):
            xa, ya = arguments(x, y)
            points.append((xa / size, ya / size, z))
    return points


def _crafter_queries() -> list[tuple[str, int, int]]:
    return [
        (form, z, size)
        for _, form, z, sizes, _ in crafter_worldgen.FIELDS
        for size in (sizes if isinstance(sizes, dict) else {sizes: 1})
    ]


def _assert_bitwise_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype == np.float64
    assert (got == want).all(), np.flatnonzero(got != want)[:10]
    assert got.tobytes() == want.tobytes()  # the sign of zero too


@pytest.mark.parametrize("seed", NOISE_SEEDS)
def test_noise3_equals_opensimplex_at_crafters_points(seed: int) -> None:
    simplex = opensimplex.OpenSimplex(seed)
    queries = _crafter_queries()
    assert len(queries) == 13  # 11 fields, two of them of two sizes
    for form, z, size in queries:
        points = _crafter_points(form, z, size)
        _assert_bitwise_equal(_vector_noise(simplex, points), _scalar_noise(simplex, points))


@pytest.mark.parametrize("seed", NOISE_SEEDS)
def test_noise3_equals_opensimplex_at_random_points_in_every_branch(seed: int) -> None:
    points = np.random.default_rng(seed).uniform(-50, 50, (3000, 3))
    cell = crafter_worldgen._Cell(*points.T)
    assert cell.near_origin.any() and cell.near_far_corner.any() and cell.in_octahedron.any()
    # Every branch noise3d's two extra vertices can take: (0,0,0) or not among the two
    # closest times the 3 closest points, in both tetrahedra; in the octahedron, 4 pairs of
    # closest points plus 4 with one replaced by (1,0,0) or (0,1,1), for either of the two.
    assert len(np.unique(crafter_worldgen._extras_key(cell))) == 6 + 6 + 12
    simplex = opensimplex.OpenSimplex(seed)
    points = points.tolist()
    _assert_bitwise_equal(_vector_noise(simplex, points), _scalar_noise(simplex, points))


def test_noise3_equals_opensimplex_where_its_comparisons_tie() -> None:
    """Points on lattices of quarters and sixths: in-cell coordinates that tie exactly
    and sums on the regions' borders, where noise3d's strict and non-strict comparisons
    pick one of two vertices (random points never tie)."""
    points = [
        point
        for denominator in (4, 6)
        for point in itertools.product(
            [k / denominator for k in range(-2 * denominator, 2 * denominator + 1)], repeat=3
        )
    ]
    simplex = opensimplex.OpenSimplex(1)
    _assert_bitwise_equal(_vector_noise(simplex, points), _scalar_noise(simplex, points))


def test_noise3_takes_a_scalar_z() -> None:
    simplex = opensimplex.OpenSimplex(3)
    x, y = np.meshgrid(np.arange(5) / 3, np.arange(4) / 7, indexing="ij")
    got = crafter_worldgen.noise3(*crafter_worldgen.permutation(simplex), x, y, 8)
    assert got.shape == (5, 4)
    want = [[simplex.noise3d(a, b, 8) for a, b in zip(xs, ys)] for xs, ys in zip(x, y)]
    _assert_bitwise_equal(got, np.array(want))


def test_noise_fields_equal_crafters_simplex_at_every_tile() -> None:
    simplex = opensimplex.OpenSimplex(42)
    fields = crafter_worldgen.noise_fields(simplex, (64, 64))
    forms = {
        "plain": lambda x, y: (x, y),
        "horizontal": lambda x, y: (2 * x, y / 5),
        "vertical": lambda x, y: (x / 5, 2 * y),
    }
    for name, form, z, sizes, normalize in crafter_worldgen.FIELDS:
        want = [
            [worldgen._simplex(simplex, *forms[form](x, y), z, sizes, normalize) for y in range(64)]
            for x in range(64)
        ]
        assert fields[name] == want, name


def _inner_crafter(seed: int) -> crafter.Env:
    """crafter's own env, built as ``CrafterEnv._make_inner`` builds ours."""
    env = crafter.Env(size=(64, 64), length=10000, seed=seed)
    env._world.__class__ = OrderedWorld
    return env


def _objects(env: crafter.Env) -> list[tuple]:
    return [
        (type(obj).__name__, tuple(obj.pos.tolist()), getattr(obj, "health", None))
        for obj in env._world.objects
    ]


def _assert_same_world(ours: crafter.Env, theirs: crafter.Env) -> None:
    np.testing.assert_array_equal(ours._world._mat_map, theirs._world._mat_map)
    np.testing.assert_array_equal(ours._world._obj_map, theirs._world._obj_map)
    assert _objects(ours) == _objects(theirs)
    for a, b in zip(ours._world.random.get_state(), theirs._world.random.get_state(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_worlds_and_episodes_equal_crafters() -> None:
    materials, creatures = set(), set()
    for seed in ENV_SEEDS:
        ours, theirs = CrafterEnv(seed=seed)._env, _inner_crafter(seed)
        assert type(ours) is FastWorldgenEnv and type(ours._world) is OrderedWorld
        actions = np.random.default_rng(seed).integers(0, len(crafter.constants.actions), STEPS)
        for episode in range(2):
            where = f"seed {seed}, episode {episode}"
            np.testing.assert_array_equal(ours.reset(), theirs.reset(), err_msg=where)
            _assert_same_world(ours, theirs)
            materials |= {theirs._world._mat_names[i] for i in np.unique(theirs._world._mat_map)}
            creatures |= {name for name, *_ in _objects(theirs)}
            for action in actions.tolist():
                obs, reward, done, info = ours.step(action)
                want_obs, want_reward, want_done, want_info = theirs.step(action)
                np.testing.assert_array_equal(obs, want_obs, err_msg=where)
                assert (reward, done) == (want_reward, want_done), where
                assert info["achievements"] == want_info["achievements"], where
            _assert_same_world(ours, theirs)
    # The worlds compared hold everything crafter's generation makes.
    assert materials >= {"grass", "sand", "water", "stone", "path", "coal", "iron", "diamond"}
    assert materials >= {"lava", "tree"}
    assert creatures >= {"Player", "Cow", "Zombie", "Skeleton"}
