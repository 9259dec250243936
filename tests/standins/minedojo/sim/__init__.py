"""Stand-in for ``minedojo.sim`` (see ``tests/standins/minedojo/__init__.py``)."""

from .inventory import InventoryItem
from .mc_meta.mc import ALL_CRAFT_SMELT_ITEMS, ALL_ITEMS

__all__ = ["ALL_CRAFT_SMELT_ITEMS", "ALL_ITEMS", "InventoryItem"]
