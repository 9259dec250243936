"""Stand-in for ``minedojo.sim.mc_meta.mc`` (MineDojo 0.1).

The name lists are loaded from ``names.json``, which ``tests/standins/make_names.py`` generated
from the real minedojo-0.1 wheel, so their contents and order match the real module.
"""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads((Path(__file__).with_name("names.json")).read_text())

ALL_ITEMS: list[str] = _DATA["ALL_ITEMS"]
ALL_HAND_CRAFT_ITEMS_NN_ACTIONS: list[str] = _DATA["ALL_HAND_CRAFT_ITEMS_NN_ACTIONS"]
ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS: list[str] = _DATA["ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS"]
ALL_SMELT_ITEMS_NN_ACTIONS: list[str] = _DATA["ALL_SMELT_ITEMS_NN_ACTIONS"]
ALL_CRAFT_SMELT_ITEMS: list[str] = _DATA["ALL_CRAFT_SMELT_ITEMS"]
# names with spaces, as they appear in obs["inventory"]["name"]
PLACEABLE_ITEM_NAMES: list[str] = _DATA["PLACEABLE_ITEM_NAMES"]
NON_MAINHAND_ITEM_NAMES: list[str] = _DATA["NON_MAINHAND_ITEM_NAMES"]
EQUIPMENT_SLOTS: list[str] = _DATA["EQUIPMENT_SLOTS"]

N_INV_SLOTS = 36  # including the main hand (slot 0)
MAX_LIFE = 20
MAX_ARMOR = 20
MAX_XP = 1395
MAX_BREATH = 300
MAX_FOOD = 20
MAX_FOOD_SATURATION = 20.0

# --- stand-in only (not in the real module) ---
# output -> (ingredients of its first recipe, output count); the real masks use the first recipe
RECIPES: dict[str, tuple[dict[str, int], int]] = {
    k: (v[0], v[1]) for k, v in _DATA["RECIPES"].items()
}
STACK_SIZES: dict[str, int] = _DATA["STACK_SIZES"]
MAX_DURABILITY: dict[str, int] = _DATA["MAX_DURABILITY"]
BEST_EQUIPMENT_SLOT: dict[str, str] = _DATA["BEST_EQUIPMENT_SLOT"]
HARVEST_TASKS: dict[str, list] = _DATA["HARVEST_TASKS"]
HARVEST_VOXEL_SIZE: dict[str, int] = _DATA["HARVEST_VOXEL_SIZE"]

assert len(ALL_CRAFT_SMELT_ITEMS) == 244
assert (
    ALL_CRAFT_SMELT_ITEMS
    == ALL_HAND_CRAFT_ITEMS_NN_ACTIONS
    + ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS
    + ALL_SMELT_ITEMS_NN_ACTIONS
)
