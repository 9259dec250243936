"""A stand-in for the ``minedojo`` package (MineDojo 0.1) for tests -- NOT the real MineDojo.

Put ``tests/standins`` first on ``sys.path``/``PYTHONPATH`` and ``import minedojo`` gets this.
``make`` has the real signature and returns an object with the interface of the real
``ARNNWrapper``-wrapped env (see ``standin_env.py`` for the toy dynamics and the test hooks).
"""

from __future__ import annotations

import re

from .sim.inventory import EQUIP_SLOTS, InventoryItem
from .sim.mc_meta import mc
from .standin_env import StandinEnv

__version__ = "0.1+standin"
IS_STANDIN = True

__all__ = ["IS_STANDIN", "InventoryItem", "StandinEnv", "make"]

# keyword arguments the real constructors accept (MineDojoSim for "open-ended", HarvestMeta for
# harvest tasks); anything else is a TypeError there, and here
_COMMON = {
    "initial_inventory",
    "start_position",
    "start_health",
    "start_food",
    "initial_weather",
    "allow_time_passage",
    "specified_biome",
    "use_voxel",
    "voxel_size",
    "use_lidar",
    "lidar_rays",
    "event_level_control",
    "sim_name",
}
_SIM_ONLY = {
    "start_time",
    "spawn_in_village",
    "drawing_str",
    "allow_mob_spawn",
    "generate_world_type",
    "regenerate_world_after_reset",
    "world_file_path",
    "flat_world_seed_string",
    "use_depth",
    "raise_error_on_invalid_cmds",
    "fast_reset_random_teleport_range",
}
_HARVEST_ONLY = {
    "target_names",
    "target_quantities",
    "reward_weights",
    "initial_mobs",
    "initial_mob_spawn_range_low",
    "initial_mob_spawn_range_high",
    "spawn_rate",
    "spawn_range_low",
    "spawn_range_high",
    "start_at_night",
}
# what a programmatic harvest task's spec already sets (passing it again is a TypeError)
_HARVEST_SPEC_KEYS = {
    "target_names",
    "target_quantities",
    "reward_weights",
    "initial_inventory",
    "use_voxel",
    "voxel_size",
    "use_lidar",
}
_UNSUPPORTED_META = {"combat", "techtree", "survival", "playthrough"}


def _parse_inventory(items) -> list[tuple[int, str, int, int]]:
    out = []
    for item in items or []:
        if not isinstance(item, InventoryItem):
            item = InventoryItem(**item) if isinstance(item, dict) else InventoryItem(*item)
        slot = EQUIP_SLOTS[item.slot] if isinstance(item.slot, str) else int(item.slot)
        assert 0 <= slot <= 40, f"invalid slot index {slot}"
        assert item.name in mc.ALL_ITEMS, f"Unknown item {item.name}"
        out.append((slot, item.name, int(item.quantity or 1), int(item.variant or 0)))
    return out


def _parse_harvest_id(task_id: str) -> tuple[str, int] | None:
    """``harvest_[<n>_]<item>[_...]`` -> (item, n) for ids that are not in MineDojo's table."""
    rest = task_id[len("harvest_") :]
    quantity = 1
    m = re.match(r"(\d+)_(.+)", rest)
    if m:
        quantity, rest = int(m.group(1)), m.group(2)
    for end in range(len(rest), 0, -1):
        name = rest[:end]
        if name in mc.ALL_ITEMS and name != "air" and (end == len(rest) or rest[end] == "_"):
            return name, quantity
    return None


def _check_kwargs(kwargs: dict, allowed: set, what: str) -> None:
    unknown = sorted(set(kwargs) - allowed - {"standin_crash_after"})
    if unknown:
        raise TypeError(f"{what}.__init__() got unexpected keyword argument(s) {unknown}")


def make(
    task_id: str,
    *args,
    image_size,
    world_seed=None,
    seed=None,
    fast_reset: bool = True,
    break_speed_multiplier: float = 1.0,
    cam_interval: int | float = 15,
    **kwargs,
) -> StandinEnv:
    """Make a (stand-in) MineDojo task, returning the ARNNWrapper-style env.

    Supported ids: ``"open-ended"`` (any case), the meta task ``"harvest"`` (with
    ``target_names``/``target_quantities``), every programmatic ``harvest_*`` id of MineDojo 0.1
    (target, quantity, initial inventory and 3x3x3 voxels as the real spec), and any other
    ``harvest_[<n>_]<item>...`` id (parsed from the name).  Other real ids (combat, techtree,
    creative, ...) raise NotImplementedError; unknown ids raise ValueError like the real one.

    Stand-in only kwarg: ``standin_crash_after=n`` (see ``StandinEnv.crash_after``).
    """
    if args:
        raise TypeError("MineDojo task constructors take keyword arguments only")
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    image_size = tuple(int(s) for s in image_size)
    if len(image_size) != 2:
        raise ValueError(f"image_size must be an int or (H, W), got {image_size}")
    kwargs = dict(kwargs)
    crash_after = kwargs.pop("standin_crash_after", None)
    low = task_id.lower()
    target = None
    initial_inventory = kwargs.get("initial_inventory")
    use_voxel = kwargs.get("use_voxel", False)
    voxel_size = kwargs.get("voxel_size")
    if low == "open-ended":
        _check_kwargs(kwargs, _COMMON | _SIM_ONLY, "MineDojoSim")
        if not fast_reset:
            kwargs.pop("fast_reset_random_teleport_range", None)
    elif low == "harvest" or task_id.startswith("harvest_"):
        _check_kwargs(kwargs, _COMMON | _HARVEST_ONLY, "HarvestMeta")
        if low == "harvest":
            names = kwargs.get("target_names")
            quantities = kwargs.get("target_quantities")
            if names is None or quantities is None:
                raise TypeError("HarvestMeta needs target_names and target_quantities")
            if not isinstance(names, str):
                if len(names) != 1:
                    raise NotImplementedError("the stand-in harvests a single target")
                names = names[0]
            if isinstance(quantities, (list, tuple)):
                quantities = quantities[0]
            elif isinstance(quantities, dict):
                quantities = quantities[names]
            weight = kwargs.get("reward_weights", 1.0)
            weight = weight[names] if isinstance(weight, dict) else weight
            target = (names, int(quantities), float(weight))
        elif task_id in mc.HARVEST_TASKS:
            clash = sorted(set(kwargs) & _HARVEST_SPEC_KEYS)
            if clash:
                raise TypeError(f"got multiple values for keyword argument(s) {clash}")
            name, quantity, inv = mc.HARVEST_TASKS[task_id]
            target = (name, int(quantity), 1.0)
            initial_inventory = [InventoryItem(slot=s, name=n, quantity=q) for s, n, q in inv]
            use_voxel, voxel_size = True, mc.HARVEST_VOXEL_SIZE
        else:
            parsed = _parse_harvest_id(task_id)
            if parsed is None:
                raise ValueError(f"Invalid task id provided {task_id}")
            target = (parsed[0], parsed[1], 1.0)
            use_voxel, voxel_size = True, mc.HARVEST_VOXEL_SIZE
    elif low in _UNSUPPORTED_META or task_id.startswith(("combat_", "techtree_", "survival")):
        raise NotImplementedError(f"the minedojo stand-in does not model {task_id!r}")
    elif task_id.startswith("creative:"):
        raise NotImplementedError(f"the minedojo stand-in does not model {task_id!r}")
    else:
        raise ValueError(f"Invalid task id provided {task_id}")

    assert kwargs.get("event_level_control", True), (
        "please use this wrapper with event_level_control = True"
    )
    assert not kwargs.get("use_depth", False), "TODO: fix depth obs bug"
    if kwargs.get("use_lidar", False):
        raise NotImplementedError("the minedojo stand-in does not model lidar rays")
    voxel_limits = None
    if use_voxel:
        v = voxel_size or dict(xmin=-1, ymin=-1, zmin=-1, xmax=1, ymax=1, zmax=1)
        voxel_limits = ((v["xmin"], v["xmax"]), (v["ymin"], v["ymax"]), (v["zmin"], v["zmax"]))
    return StandinEnv(
        task_id,
        image_size=image_size,
        world_seed=world_seed,
        seed=seed,
        fast_reset=fast_reset,
        fast_reset_random_teleport_range=kwargs.get("fast_reset_random_teleport_range"),
        break_speed_multiplier=break_speed_multiplier,
        cam_interval=cam_interval,
        target=target,
        initial_inventory=_parse_inventory(initial_inventory),
        voxel_limits=voxel_limits,
        start_position=kwargs.get("start_position"),
        start_health=kwargs.get("start_health"),
        start_food=kwargs.get("start_food"),
        standin_crash_after=crash_after,
    )
