"""Stand-in for ``minedojo.sim.inventory``: the ``InventoryItem`` record and slot names."""

from __future__ import annotations

from typing import NamedTuple

# slot index of each equipment slot in MineDojo's 41-slot player inventory
EQUIP_SLOTS = {"mainhand": 0, "offhand": 40, "head": 39, "chest": 38, "legs": 37, "feet": 36}


class InventoryItem(NamedTuple):
    slot: str | int  # an index 0..40 or a name from EQUIP_SLOTS
    name: str
    variant: int | None = None
    quantity: int | None = None
