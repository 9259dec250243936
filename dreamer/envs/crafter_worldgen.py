"""Crafter's world generation, vectorized: the same world, exactly, several times sooner.

``crafter.Env.reset()`` spends ~0.4 s making its 64x64 world, ~80% of it in the pure-Python
``OpenSimplex.noise3d`` of ``opensimplex==0.3``, called ~27,000 times, once per tile and
noise field. Here every noise field crafter's ``worldgen._set_material`` may read is computed
at once over the whole grid by ``noise3``, a numpy port of ``noise3d`` that evaluates each
floating-point expression with the same operands in the same order, so that it returns the
same float64 values bit for bit. The tiles then take crafter's decisions in crafter's order,
drawing the same ``world.random.uniform()`` numbers, so the world and the world's RNG state
come out identical to crafter's; the objects are placed by crafter's own ``_set_object``.
"""

from __future__ import annotations

import itertools

import numpy as np
import opensimplex
from crafter import worldgen
from opensimplex.opensimplex import (
    GRADIENTS_3D,
    NORM_CONSTANT_3D,
    SQUISH_CONSTANT_3D,
    STRETCH_CONSTANT_3D,
)

AXIS_BITS = (1, 2, 4)  # noise3d names a cell's corner by the bits of its stepped axes

# Where a vertex lies on one axis, as noise3d writes its offset there: (before, squish,
# after) stands for ``((d0 - before) - squish * SQUISH_CONSTANT_3D) - after``, d0 being the
# offset from the cell's base, and the vertex's lattice coordinate is base + before + after.
# So ``dx0 + 1 - SQUISH_CONSTANT_3D`` is (-1, 1, 0), and ``dy_ext1 -= 1`` after
# ``dy0 - 1 - 3 * SQUISH_CONSTANT_3D`` is (1, 3, 1).
Step = tuple[int, int, int]
Vertex = tuple[Step, Step, Step]

# The cell's corners each region adds, in noise3d's order. Each list keeps the order of
# CORNERS, so one pass over CORNERS adds every point's corners in noise3d's order.
NEAR_ORIGIN = ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1))
NEAR_FAR_CORNER = ((1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1))
OCTAHEDRON = ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1))
CORNERS = ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1))


def _corner(corner: tuple[int, int, int]) -> Vertex:
    """``d0 - 1 - squish`` on a stepped axis, ``d0 - 0 - squish`` on another."""
    return tuple((on, sum(corner), 0) for on in corner)


def _pairs(per_axis: list[tuple[Step, Step]]) -> tuple[Vertex, Vertex]:
    return tuple(p[0] for p in per_axis), tuple(p[1] for p in per_axis)


# The two extra vertices each region adds, a port of noise3d's branches taking its decisions
# as arguments; these fill EXTRAS, a table the vectorized decisions index.


def _extras_near_origin(c: int, origin_is_closest: bool) -> tuple[Vertex, Vertex]:
    if not origin_is_closest:  # c: the two closest vertices
        return _pairs(
            [((1, 2, 0), (1, 1, 0)) if c & bit else ((0, 2, 0), (-1, 1, 0)) for bit in AXIS_BITS]
        )
    # c: the closest vertex but (0,0,0)
    x = ((1, 0, 0), (1, 0, 0)) if c & 1 else ((-1, 0, 0), (0, 0, 0))
    if c & 2:
        y = ((1, 0, 0), (1, 0, 0))
    else:
        y = ((-1, 0, 0), (0, 0, 0)) if c & 1 else ((0, 0, 0), (-1, 0, 0))
    z = ((1, 0, 0), (1, 0, 0)) if c & 4 else ((0, 0, 0), (-1, 0, 0))
    return _pairs([x, y, z])


def _extras_near_far_corner(c: int, corner_is_closest: bool) -> tuple[Vertex, Vertex]:
    if not corner_is_closest:  # c: the axes the two closest vertices share
        return _pairs(
            [((1, 1, 0), (2, 2, 0)) if c & bit else ((0, 1, 0), (0, 2, 0)) for bit in AXIS_BITS]
        )
    # c: the closest vertex but (1,1,1)
    x = ((2, 3, 0), (1, 3, 0)) if c & 1 else ((0, 3, 0), (0, 3, 0))
    if c & 2:
        y = ((1, 3, 0), (1, 3, 1)) if c & 1 else ((1, 3, 1), (1, 3, 0))
    else:
        y = ((0, 3, 0), (0, 3, 0))
    z = ((1, 3, 0), (2, 3, 0)) if c & 4 else ((0, 3, 0), (0, 3, 0))
    return _pairs([x, y, z])


def _extras_in_octahedron(a: int, b: int, a_far: bool, b_far: bool) -> tuple[Vertex, Vertex]:
    """a, b: the two closest points; ``_far``: on the (1,1,1) side."""
    if a_far and b_far:
        return _corner((1, 1, 1)), _two_steps(a & b, squish_first=False)
    if not a_far and not b_far:
        return _corner((0, 0, 0)), _step_back(a | b)
    far, near = (a, b) if a_far else (b, a)
    return _step_back(far), _two_steps(near, squish_first=True)


def _first_axis(first: bool, second: bool) -> int:
    return 0 if first else 1 if second else 2


def _step_back(c: int) -> Vertex:
    """A permutation of (1,1,-1): back on the first axis c lacks."""
    back = _first_axis(c & 1 == 0, c & 2 == 0)
    return tuple((-1, 1, 0) if axis == back else (1, 1, 0) for axis in range(3))


def _two_steps(c: int, squish_first: bool) -> Vertex:
    """A permutation of (0,0,2), on the first axis c holds."""
    double = _first_axis(c & 1 != 0, c & 2 != 0)
    step = (0, 2, 2) if squish_first else (2, 2, 0)
    return tuple(step if axis == double else (0, 2, 0) for axis in range(3))


# EXTRAS[..., key]: the two extra vertices; keys 0-15 near the origin (8 * closest + c), 16-31
# near the far corner (the same, plus 16), 32-287 in the octahedron (32 + 8 * a + b, plus
# 64 if a is on the far side and 128 if b is).
def _extras_table() -> np.ndarray:
    table = np.zeros((288, 2, 3, 3), np.int64)
    for c, closest in itertools.product(range(8), (False, True)):
        table[8 * closest + c] = _extras_near_origin(c, closest)
        table[16 + 8 * closest + c] = _extras_near_far_corner(c, closest)
    for a, b, a_far, b_far in itertools.product(range(8), range(8), (False, True), (False, True)):
        table[32 + 8 * a + b + 64 * a_far + 128 * b_far] = _extras_in_octahedron(a, b, a_far, b_far)
    return table


# laid out (2, 3, 3, key): one gather by every point's key picks its two vertices
EXTRAS = np.ascontiguousarray(np.moveaxis(_extras_table(), 0, -1))


class _Cell:
    """Where each point lies in the simplectic honeycomb: noise3d's first lines."""

    def __init__(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> None:
        stretch_offset = (x + y + z) * STRETCH_CONSTANT_3D
        stretched = (x + stretch_offset, y + stretch_offset, z + stretch_offset)
        self.base = tuple(np.floor(s).astype(np.int64) for s in stretched)
        xsb, ysb, zsb = self.base
        squish_offset = (xsb + ysb + zsb) * SQUISH_CONSTANT_3D
        self.inside = tuple(s - b for s, b in zip(stretched, self.base))
        self.in_sum = self.inside[0] + self.inside[1] + self.inside[2]
        self.delta = tuple(p - (b + squish_offset) for p, b in zip((x, y, z), self.base))
        self.near_origin = self.in_sum <= 1
        self.near_far_corner = ~self.near_origin & (self.in_sum >= 2)
        self.in_octahedron = ~self.near_origin & ~self.near_far_corner


def _pick(mask: np.ndarray, a, b) -> np.ndarray:
    """``np.where(mask, a, b)`` for integers, without its per-element branch (slow here)."""
    return b + mask * (a - b)


def _extras_key(cell: _Cell) -> np.ndarray:
    """Each point's key into EXTRAS: the branch noise3d takes for its two extra vertices."""
    return _pick(
        cell.near_origin,
        _extras_key_near_origin(cell),
        _pick(
            cell.near_far_corner,
            _extras_key_near_far_corner(cell),
            _extras_key_in_octahedron(cell),
        ),
    )


def _extras_key_near_origin(cell: _Cell) -> np.ndarray:
    xins, yins, zins = cell.inside
    a_takes_z = (xins < yins) & (zins > xins)
    b_takes_z = (xins >= yins) & (zins > yins)
    a_score, a_point = np.where(a_takes_z, zins, xins), _pick(a_takes_z, 4, 1)
    b_score, b_point = np.where(b_takes_z, zins, yins), _pick(b_takes_z, 4, 2)
    wins = 1 - cell.in_sum
    origin_is_closest = (wins > a_score) | (wins > b_score)
    closest = _pick(b_score > a_score, b_point, a_point)
    return 8 * origin_is_closest + _pick(origin_is_closest, closest, a_point | b_point)


def _extras_key_near_far_corner(cell: _Cell) -> np.ndarray:
    xins, yins, zins = cell.inside
    a_takes_z = (xins > yins) & (zins < xins)
    b_takes_z = (xins <= yins) & (zins < yins)
    a_score, a_point = np.where(a_takes_z, zins, xins), _pick(a_takes_z, 3, 6)
    b_score, b_point = np.where(b_takes_z, zins, yins), _pick(b_takes_z, 3, 5)
    wins = 3 - cell.in_sum
    corner_is_closest = (wins < a_score) | (wins < b_score)
    closest = _pick(b_score < a_score, b_point, a_point)
    return 16 + 8 * corner_is_closest + _pick(corner_is_closest, closest, a_point & b_point)


def _extras_key_in_octahedron(cell: _Cell) -> np.ndarray:
    xins, yins, zins = cell.inside
    a_far, a_score, a_point = _closer_of_pair(xins + yins, 3, 4)
    b_far, b_score, b_point = _closer_of_pair(xins + zins, 5, 2)
    third_far, third_score, third_point = _closer_of_pair(yins + zins, 6, 1)
    replaces_a = (a_score <= b_score) & (a_score < third_score)
    replaces_b = (a_score > b_score) & (b_score < third_score)
    a_point, a_far = _pick(replaces_a, third_point, a_point), _pick(replaces_a, third_far, a_far)
    b_point, b_far = _pick(replaces_b, third_point, b_point), _pick(replaces_b, third_far, b_far)
    return 32 + 8 * a_point + b_point + 64 * a_far + 128 * b_far


def _closer_of_pair(p: np.ndarray, far_point: int, near_point: int):
    """(1 if on the (1,1,1) side else 0, score, point) as noise3d's ``if p > 1`` decides."""
    far = p > 1
    return far.astype(np.int64), np.where(far, p - 1, 1 - p), _pick(far, far_point, near_point)


def _contribution(tables, cell: _Cell, vertex) -> np.ndarray:
    """noise3d's ``attn**4 * extrapolate(...)`` at a vertex given as (before, squish, after)
    per axis (ints or int arrays); ±0.0 where ``attn <= 0``, where noise3d adds nothing."""
    perm, gradients = tables
    lattice, offset = [], []
    for (before, squish, after), base, d0 in zip(vertex, cell.base, cell.delta):
        lattice.append(base + before + after)
        offset.append(((d0 - before) - squish * SQUISH_CONSTANT_3D) - after)
    (xsv, ysv, zsv), (dx, dy, dz) = lattice, offset
    attn = np.maximum(2 - dx * dx - dy * dy - dz * dz, 0.0)
    hashed = (perm[(perm[xsv & 0xFF] + ysv) & 0xFF] + zsv) & 0xFF
    gx, gy, gz = (g[hashed] for g in gradients)
    squared = attn * attn
    return squared * squared * (gx * dx + gy * dy + gz * dz)


def noise3(perm: np.ndarray, grad_index: np.ndarray, x: np.ndarray, y: np.ndarray, z) -> np.ndarray:
    """opensimplex 0.3's ``OpenSimplex.noise3d`` at every point of ``x``, ``y`` (one shape)
    and ``z`` (a scalar or that shape), equal to it bit for bit. ``perm`` and ``grad_index``
    are an ``OpenSimplex``'s ``_perm`` and ``_perm_grad_index_3D`` as int64 arrays."""
    x, y, z = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (x, y, z)))
    cell = _Cell(x, y, z)
    gradients = np.array(GRADIENTS_3D, np.float64)
    tables = perm, tuple(gradients[grad_index + axis] for axis in range(3))
    # Adding ±0.0 leaves a sum unchanged, and these sums start at 0.0 and never reach -0.0.
    regions = (
        (cell.near_origin, NEAR_ORIGIN),
        (cell.near_far_corner, NEAR_FAR_CORNER),
        (cell.in_octahedron, OCTAHEDRON),
    )
    value = np.zeros_like(x)
    for corner in CORNERS:
        adds = np.logical_or.reduce([mask for mask, corners in regions if corner in corners])
        value = value + adds * _contribution(tables, cell, _corner(corner))
    for vertex in np.take(EXTRAS, _extras_key(cell), axis=-1):
        value = value + _contribution(tables, cell, vertex)
    return value / NORM_CONSTANT_3D


def permutation(simplex: opensimplex.OpenSimplex) -> tuple[np.ndarray, np.ndarray]:
    """An ``OpenSimplex``'s seeded tables, for ``noise3``."""
    return np.array(simplex._perm, np.int64), np.array(simplex._perm_grad_index_3D, np.int64)


# Every noise crafter's ``_set_material`` may read, as its ``_simplex(x, y, z, sizes,
# normalize)`` calls: (name, coordinates, z, sizes, normalize); "plain" is (x, y), the
# tunnels' are (2 * x, y / 5) and (x / 5, 2 * y).
FIELDS = (
    ("start", "plain", 8, 3, True),
    ("water", "plain", 3, {15: 1, 5: 0.15}, False),
    ("mountain", "plain", 0, {15: 1, 5: 0.3}, True),
    ("cave", "plain", 6, 7, True),
    ("horizontal_tunnel", "horizontal", 7, 3, True),
    ("vertical_tunnel", "vertical", 7, 3, True),
    ("coal", "plain", 1, 8, True),
    ("iron", "plain", 2, 6, True),
    ("lava", "plain", 6, 5, True),
    ("sand", "plain", 4, 9, True),
    ("tree", "plain", 5, 7, True),
)


def _coordinates(area: tuple[int, int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    x, y = np.meshgrid(np.arange(area[0]), np.arange(area[1]), indexing="ij")
    return {"plain": (x, y), "horizontal": (2 * x, y / 5), "vertical": (x / 5, 2 * y)}


def noise_fields(simplex: opensimplex.OpenSimplex, area: tuple[int, int]) -> dict[str, list]:
    """Each of ``FIELDS`` over the grid, as nested lists of floats (``[x][y]``), equal to
    crafter's ``_simplex`` at each tile; one ``noise3`` call evaluates them all."""
    coordinates = _coordinates(area)
    queries = []
    for _, form, z, sizes, _ in FIELDS:
        x, y = coordinates[form]
        for size in _weights(sizes):
            queries.append((x / size, y / size, np.full(x.shape, z, np.float64)))
    flat = [np.concatenate([q[i].ravel() for q in queries]) for i in range(3)]
    noise = iter(np.split(noise3(*permutation(simplex), *flat), len(queries)))
    fields = {}
    for name, _, _, sizes, normalize in FIELDS:
        weights = _weights(sizes)
        value = np.zeros(area)
        for weight in weights.values():
            value = value + weight * next(noise).reshape(area)
        if normalize:
            value = value / sum(weights.values())
        fields[name] = value.tolist()
    return fields


def _weights(sizes: int | dict) -> dict:
    return sizes if isinstance(sizes, dict) else {sizes: 1}


def generate_world(world, player) -> None:
    """``crafter.worldgen.generate_world(world, player)``, with the noise vectorized."""
    simplex = opensimplex.OpenSimplex(seed=world.random.randint(0, 2**31 - 1))
    fields = noise_fields(simplex, world.area)
    tunnels = np.zeros(world.area, bool)
    for x in range(world.area[0]):
        for y in range(world.area[1]):
            material, tunnel = _material(world, player, x, y, fields)
            world[x, y] = material
            if tunnel:
                tunnels[x, y] = True
    for x in range(world.area[0]):
        for y in range(world.area[1]):
            worldgen._set_object(world, (x, y), player, tunnels)


def _material(world, player, x: int, y: int, fields: dict[str, list]) -> tuple[str, bool]:
    """crafter's ``_set_material`` at (x, y): (material, whether it is a tunnel). It draws
    ``world.random.uniform()`` where crafter does, and does crafter's arithmetic."""
    uniform = world.random.uniform
    start = 4 - np.sqrt((x - player.pos[0]) ** 2 + (y - player.pos[1]) ** 2)
    start += 2 * fields["start"][x][y]
    start = 1 / (1 + np.exp(-start))
    water = fields["water"][x][y] + 0.1
    water -= 2 * start
    mountain = fields["mountain"][x][y]
    mountain -= 4 * start + 0.3 * water
    if start > 0.5:
        return "grass", False
    if mountain > 0.15:
        if fields["cave"][x][y] > 0.15 and mountain > 0.3:
            return "path", False
        if fields["horizontal_tunnel"][x][y] > 0.4 or fields["vertical_tunnel"][x][y] > 0.4:
            return "path", True
        if fields["coal"][x][y] > 0 and uniform() > 0.85:
            return "coal", False
        if fields["iron"][x][y] > 0.4 and uniform() > 0.75:
            return "iron", False
        if mountain > 0.18 and uniform() > 0.994:
            return "diamond", False
        if mountain > 0.3 and fields["lava"][x][y] > 0.35:
            return "lava", False
        return "stone", False
    if 0.25 < water <= 0.35 and fields["sand"][x][y] > -0.2:
        return "sand", False
    if 0.3 < water:
        return "water", False
    if fields["tree"][x][y] > 0 and uniform() > 0.8:
        return "tree", False
    return "grass", False
