"""Generate ``minedojo/sim/mc_meta/names.json`` for the MineDojo stand-in.

This script was run once against the unpacked minedojo-0.1 wheel, obtained with::

    pip download minedojo==0.1 --no-deps
    python -m zipfile -e minedojo-0.1-py3-none-any.whl /tmp/md/x
    python tests/standins/make_names.py /tmp/md/x/minedojo

Its output is committed, so the tests never need the wheel.  The lists are computed by
executing the wheel's own ``sim/mc_meta/mc.py`` (loaded by file path so that the package
``__init__`` -- which needs gym and a JDK -- is never imported), so names and orders are exactly
those of MineDojo 0.1.  The programmatic harvest task table is expanded from the wheel's
``tasks_specs.yaml`` the same way ``minedojo.tasks`` expands it.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import re
import sys
from pathlib import Path

import yaml

VOXEL_SIZE = dict(xmin=-1, ymin=-1, zmin=-1, xmax=1, ymax=1, zmax=1)
OUT = Path(__file__).resolve().parent / "minedojo" / "sim" / "mc_meta" / "names.json"


def _load_mc(root: Path):
    spec = importlib.util.spec_from_file_location("_real_mc", root / "sim" / "mc_meta" / "mc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _all_vars(root: Path) -> dict:
    """Read the literal ``_ALL_VARS`` dict from ``tasks/__init__.py`` without importing it."""
    tree = ast.parse((root / "tasks" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_ALL_VARS" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise RuntimeError("_ALL_VARS not found")


def _fill(x, values: dict):
    if isinstance(x, dict):
        return {k: _fill(v, values) for k, v in x.items()}
    if isinstance(x, str):
        return x.format(**values)
    return x


def _placeholders(x, acc: set) -> set:
    if isinstance(x, dict):
        for v in x.values():
            _placeholders(v, acc)
    elif isinstance(x, str):
        acc.update(re.findall(r"\{(.*?)\}", x))
    return acc


def _harvest_tasks(root: Path) -> dict:
    desc = root / "tasks" / "description_files"
    specs = yaml.safe_load((desc / "tasks_specs.yaml").read_text())
    programmatic = yaml.safe_load((desc / "programmatic_tasks.yaml").read_text())
    variables = _all_vars(root)
    out = {}
    for raw_id, spec in specs.items():
        if spec.get("__cls__") != "harvest":
            continue
        names = sorted(_placeholders(spec, set(re.findall(r"\{(.*?)\}", raw_id))))
        for combo in itertools.product(*(variables[n] for n in names)):
            values = dict(zip(names, combo))
            task_id = raw_id.format(**values)
            if task_id not in programmatic:
                continue
            filled = _fill(spec, values)
            inv = [
                [slot, item["name"], int(item.get("quantity", 1))]
                for slot, item in (filled.get("initial_inventory") or {}).items()
            ]
            # every 0.1 harvest task observes 3x3x3 voxels; the stand-in hard-codes that
            assert filled.get("use_voxel") is True and not filled.get("use_lidar"), task_id
            assert filled["voxel_size"] == VOXEL_SIZE, task_id
            out[task_id] = [filled["target_names"], int(filled["target_quantities"]), inv]
    return dict(sorted(out.items()))


def main(root: str) -> None:
    root = Path(root)
    mc = _load_mc(root)
    items = {it["type"]: it for it in mc.all_data["items"]}
    hand = list(mc.ALL_HAND_CRAFT_ITEMS_NN_ACTIONS)
    table = list(mc.ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS)
    recipes = {}
    for name in mc.ALL_CRAFT_SMELT_ITEMS:
        # ARMasksWrapper uses the first recipe of each output (utils.get_recipes_matrix).
        if name in hand or name in table:
            first = mc.CRAFTING_RECIPES_BY_OUTPUT[name][0]
            count = first.get("outputCount", 1)
        else:
            first = mc.SMELTING_RECIPES_BY_OUTPUT[name][0]
            count = first.get("out", 1)
        recipes[name] = [dict(first["ingredients"]), int(count)]
    data = {
        "SOURCE": "minedojo==0.1 wheel, sim/mc_meta/mc.py + mc_constants.json",
        "ALL_ITEMS": list(mc.ALL_ITEMS),
        "ALL_CRAFT_SMELT_ITEMS": list(mc.ALL_CRAFT_SMELT_ITEMS),
        "ALL_HAND_CRAFT_ITEMS_NN_ACTIONS": hand,
        "ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS": table,
        "ALL_SMELT_ITEMS_NN_ACTIONS": list(mc.ALL_SMELT_ITEMS_NN_ACTIONS),
        "PLACEABLE_ITEM_NAMES": list(mc.PLACEABLE_ITEM_NAMES),
        "NON_MAINHAND_ITEM_NAMES": list(mc.NON_MAINHAND_ITEM_NAMES),
        "EQUIPMENT_SLOTS": list(mc.EQUIPMENT_SLOTS),
        # bestEquipmentSlot of the non-mainhand items (where "equip" puts them)
        "BEST_EQUIPMENT_SLOT": {
            n.replace(" ", "_"): items[n.replace(" ", "_")]["bestEquipmentSlot"]
            for n in mc.NON_MAINHAND_ITEM_NAMES
        },
        # output -> [ingredients of its first recipe, output count]
        "RECIPES": recipes,
        # only the items that differ from the default stack size 64
        "STACK_SIZES": {n: it["stackSize"] for n, it in items.items() if it["stackSize"] != 64},
        "MAX_DURABILITY": {n: it["maxDamage"] for n, it in items.items() if it["damageable"]},
        # programmatic harvest task id -> [target, quantity, [[slot, name, qty], ...]]
        "HARVEST_VOXEL_SIZE": VOXEL_SIZE,
        "HARVEST_TASKS": _harvest_tasks(root),
    }
    assert len(data["ALL_CRAFT_SMELT_ITEMS"]) == 244
    OUT.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))}" for k, v in data.items()]
    OUT.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes), {len(data['HARVEST_TASKS'])} harvest tasks")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/md/x/minedojo")
