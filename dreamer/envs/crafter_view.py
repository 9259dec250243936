"""Crafter's local view, drawn from the world's maps: the same canvas, byte for byte, sooner.

``crafter.engine.LocalView.__call__`` takes about half of a Crafter step: it looks each of the
view's cells up through the pure-Python ``World.__getitem__`` and walks every object of the
world (hundreds) to find the few inside the view. Here the view's window of ``_mat_map``
picks the material textures in one gather, and the window of ``_obj_map`` names the objects
to draw. crafter's ``World.add`` and ``World.move`` keep ``_obj_map`` exact: every live
object sits in its own cell, which holds its index into ``_objects`` (two objects never
share a cell, and every object's cell lies in the world, as moves and placements go only to
cells ``World.__getitem__`` finds inside). The objects are blended by crafter's own
``_draw_alpha`` in crafter's order (no canvas can show it, each object covering its own
cell), then crafter's own ``_light`` and ``_sleep`` run, so the night noise draws the same
numbers from ``world.random``.
"""

from __future__ import annotations

import numpy as np
from crafter import engine

BACKGROUND = 127  # crafter's canvas where the view reaches past the world's border


class LocalView(engine.LocalView):
    """``crafter.engine.LocalView`` with the same constructor and the same canvases."""

    def __init__(self, world, textures, grid) -> None:
        super().__init__(world, textures, grid)
        self._tile_stacks: dict[tuple, np.ndarray] = {}

    def __call__(self, player, unit):
        self._unit = np.array(unit)
        self._center = np.array(player.pos)
        canvas = self._draw_materials()
        self._draw_objects(canvas)
        canvas = self._light(canvas, self._world.daylight)
        if player.sleeping:
            canvas = self._sleep(canvas)
        return canvas

    def _window(self, world_map: np.ndarray, fill: int) -> np.ndarray:
        """The view's cells of a world-sized map; ``fill`` where they lie outside the world."""
        corner = self._center - self._offset
        low = np.maximum(corner, 0)
        high = np.minimum(corner + self._grid, self._area)
        window = np.full(tuple(self._grid), fill, np.intp)
        if (low < high).all():
            window[
                low[0] - corner[0] : high[0] - corner[0], low[1] - corner[1] : high[1] - corner[1]
            ] = world_map[low[0] : high[0], low[1] : high[1]]
        return window

    def _tile_stack(self) -> np.ndarray:
        """Each material id's texture (RGB, as ``_draw`` copies it), then a background tile."""
        unit = tuple(int(size) for size in self._unit)
        key = unit, len(self._world._mat_names)
        if key not in self._tile_stacks:
            tiles = [
                self._textures.get(self._world._mat_names[id_], self._unit)[..., :3]
                for id_ in range(len(self._world._mat_names))
            ]
            tiles.append(np.full(unit + (3,), BACKGROUND, np.uint8))
            self._tile_stacks[key] = np.stack(tiles)
        return self._tile_stacks[key]

    def _draw_materials(self) -> np.ndarray:
        tile_stack = self._tile_stack()
        material_ids = self._window(self._world._mat_map, fill=len(tile_stack) - 1)
        tiles = tile_stack[material_ids]  # (grid x, grid y, unit x, unit y, 3)
        (grid_x, grid_y), (unit_x, unit_y) = material_ids.shape, tiles.shape[2:4]
        return tiles.transpose(0, 2, 1, 3, 4).reshape(grid_x * unit_x, grid_y * unit_y, 3)

    def _draw_objects(self, canvas: np.ndarray) -> None:
        object_ids = self._window(self._world._obj_map, fill=0)
        for index in np.sort(object_ids[object_ids > 0]).tolist():
            obj = self._world._objects[index]
            cell = obj.pos - self._center + self._offset
            texture = self._textures.get(obj.texture, self._unit)
            engine._draw_alpha(canvas, cell * self._unit, texture)


class ItemView(engine.ItemView):
    """``crafter.engine.ItemView`` keeping its last canvas: the inventory changes on few
    steps, and drawing it took ~0.3 ms of each. The canvas is read-only (crafter's
    ``render`` copies it into the frame)."""

    def __init__(self, textures, grid) -> None:
        super().__init__(textures, grid)
        self._last: tuple[tuple, np.ndarray] | None = None

    def __call__(self, inventory, unit):
        key = tuple(inventory.items()), tuple(np.asarray(unit).tolist())
        if self._last is None or self._last[0] != key:
            canvas = super().__call__(inventory, unit)
            canvas.flags.writeable = False
            self._last = key, canvas
        return self._last[1]
