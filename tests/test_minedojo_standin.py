"""Contract tests for the MineDojo stand-in (tests/standins/minedojo).

The expected layouts below are written out from MineDojo 0.1's sources (ARNNWrapper over
MineDojoSim: sim/handlers/agent/observations/*.py, sim/wrappers/ar_nn/*.py), not derived from
the stand-in, so a drift of the stand-in away from the real interface fails here.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "standins"))

import minedojo  # noqa: E402  (the stand-in)
from minedojo.sim import InventoryItem  # noqa: E402
from minedojo.sim.mc_meta import mc  # noqa: E402

F32, I64, B, U = "float32", "int64", "bool", "str"
H, W = 48, 64


def _inv(n):
    return {
        "cur_durability": ((n,), F32),
        "max_durability": ((n,), F32),
        "name": ((n,), U),
        "quantity": ((n,), F32),
        "variant": ((n,), I64),
    }


# leaf path -> (shape, dtype) of minedojo.make("open-ended", image_size=(H, W)).reset()
EXPECTED_OBS = {
    "rgb": ((3, H, W), "uint8"),
    "inventory": _inv(36),
    "equipment": _inv(6),
    "life_stats": {
        "armor": ((1,), F32),
        "food": ((1,), F32),
        "is_sleeping": ((), B),  # Malmo sends a JSON bool; MineDojo passes it through
        "life": ((1,), F32),
        "oxygen": ((1,), F32),
        "saturation": ((1,), F32),
        "xp": ((1,), F32),
    },
    "location_stats": {
        "biome_id": ((), I64),
        "can_see_sky": ((), B),
        "is_raining": ((), B),
        "light_level": ((1,), F32),
        "pitch": ((1,), F32),
        "pos": ((3,), F32),
        "rainfall": ((1,), F32),
        "sea_level": ((1,), F32),
        "sky_light_level": ((1,), F32),
        "sun_brightness": ((1,), F32),
        "temperature": ((1,), F32),
        "yaw": ((1,), F32),
    },
    "nearby_tools": {"table": ((), B), "furnace": ((), B)},
    "damage_source": {
        "damage_amount": ((1,), F32),
        "damage_distance": ((1,), F32),
        "damage_pitch": ((1,), F32),
        "damage_yaw": ((1,), F32),
        "hunger_damage": ((1,), F32),
        "is_explosion": ((), B),
        "is_fire_damage": ((), B),
        "is_magic_damage": ((), B),
        "is_projectile": ((), B),
        "is_unblockable": ((), B),
    },
    "masks": {
        "action_type": ((8,), B),
        "action_arg": ((8, 1), B),
        "equip": ((36,), B),
        "place": ((36,), B),
        "destroy": ((36,), B),
        "craft_smelt": ((244,), B),
    },
    "delta_inv": {
        "inc_name_by_craft": ((1,), U),
        "inc_quantity_by_craft": ((1,), F32),
        "dec_name_by_craft": ((4,), U),
        "dec_quantity_by_craft": ((4,), F32),
        "inc_name_by_other": ((1,), U),
        "inc_quantity_by_other": ((1,), F32),
        "dec_name_by_other": ((4,), U),
        "dec_quantity_by_other": ((4,), F32),
    },
}
EXPECTED_VOXELS = {  # harvest tasks: use_voxel with a 3x3x3 grid
    "block_name": ((3, 3, 3), U),
    "block_meta": ((3, 3, 3), I64),
    "is_collidable": ((3, 3, 3), B),
    "is_tool_not_required": ((3, 3, 3), B),
    "blocks_movement": ((3, 3, 3), B),
    "is_liquid": ((3, 3, 3), B),
    "is_solid": ((3, 3, 3), B),
    "can_burn": ((3, 3, 3), B),
    "blocks_light": ((3, 3, 3), B),
    "cos_look_vec_angle": ((3, 3, 3), F32),
}
NOOP = np.array([0, 0, 0, 12, 12, 0, 0, 0])
FN = {
    "no_op": 0,
    "use": 1,
    "drop": 2,
    "attack": 3,
    "craft": 4,
    "equip": 5,
    "place": 6,
    "destroy": 7,
}
CRAFT = {n: mc.ALL_CRAFT_SMELT_ITEMS.index(n) for n in ("planks", "crafting_table")}


@pytest.fixture(autouse=True)
def _fast_launch(monkeypatch):
    monkeypatch.setenv("MINEDOJO_STANDIN_LAUNCH_SECONDS", "0")
    monkeypatch.delenv("MINEDOJO_STANDIN_LOG", raising=False)
    monkeypatch.delenv("MINEDOJO_STANDIN_CRASH_DIR", raising=False)


def act(fn="no_op", craft=0, slot=0, move=(0, 0, 0), pitch=12, yaw=12):
    return np.array([*move, pitch, yaw, FN[fn], craft, slot])


def layout(obs):
    out = {}
    for k, v in obs.items():
        if isinstance(v, dict):
            out[k] = layout(v)
        else:
            kind = U if v.dtype.kind == "U" else str(v.dtype)
            out[k] = (v.shape, kind)
    return out


def flat(tree, prefix=""):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from flat(v, prefix + k + ".")
        else:
            yield prefix + k, v


def flat_spaces(space, prefix=""):
    for k, v in space.spaces.items():
        if hasattr(v, "spaces"):
            yield from flat_spaces(v, prefix + k + ".")
        else:
            yield prefix + k, v


def reference_masks(obs):
    """ARMasksWrapper's rules, re-implemented independently from the obs alone."""
    names = obs["inventory"]["name"]
    counts = Counter()
    for n, q in zip(names, obs["inventory"]["quantity"]):
        counts[str(n).replace(" ", "_")] += q
    table, furnace = bool(obs["nearby_tools"]["table"]), bool(obs["nearby_tools"]["furnace"])
    craft = []
    for item in mc.ALL_CRAFT_SMELT_ITEMS:
        ok = all(counts[i] >= c for i, c in mc.RECIPES[item][0].items())
        if item in mc.ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS:
            ok = ok and table
        if item in mc.ALL_SMELT_ITEMS_NN_ACTIONS:
            ok = ok and furnace
        craft.append(ok)
    craft = np.array(craft)
    occupied = names != "air"
    equip = occupied.copy()
    equip[0] = occupied[0] and names[0] in mc.NON_MAINHAND_ITEM_NAMES
    place = occupied & np.array([n in mc.PLACEABLE_ITEM_NAMES for n in names])
    action_type = [
        True,
        True,
        bool(occupied[0]),
        True,
        bool(craft.any() and not occupied.all()),
        bool(equip.any()),
        bool(place.any()),
        bool(occupied.any()),
    ]
    return {
        "action_type": np.array(action_type),
        "action_arg": np.array([[0], [0], [0], [0], [1], [1], [1], [1]], dtype=bool),
        "equip": equip,
        "place": place,
        "destroy": occupied,
        "craft_smelt": craft,
    }


def assert_masks_consistent(obs):
    ref = reference_masks(obs)
    for k, v in ref.items():
        np.testing.assert_array_equal(obs["masks"][k], v, err_msg=k)


def count(obs, name):
    return float(obs["inventory"]["quantity"][obs["inventory"]["name"] == name].sum())


# ---------------------------------------------------------------------------- interface


def test_mc_constants_match_minedojo_0_1():
    assert len(mc.ALL_ITEMS) == 392 and "air" in mc.ALL_ITEMS
    assert len(mc.ALL_CRAFT_SMELT_ITEMS) == 244
    assert (
        mc.ALL_HAND_CRAFT_ITEMS_NN_ACTIONS
        + mc.ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS
        + mc.ALL_SMELT_ITEMS_NN_ACTIONS
        == mc.ALL_CRAFT_SMELT_ITEMS
    )
    assert (len(mc.ALL_HAND_CRAFT_ITEMS_NN_ACTIONS), len(mc.ALL_SMELT_ITEMS_NN_ACTIONS)) == (54, 20)
    assert mc.ALL_CRAFT_SMELT_ITEMS[:3] == ["blaze_powder", "book", "brick_block"]
    assert mc.ALL_CRAFT_SMELT_ITEMS[-1] == "stone"
    assert "crafting table" in mc.PLACEABLE_ITEM_NAMES and "shield" in mc.NON_MAINHAND_ITEM_NAMES
    assert mc.RECIPES["planks"] == ({"log": 1}, 4)
    assert mc.RECIPES["crafting_table"] == ({"planks": 4}, 1)
    assert (mc.N_INV_SLOTS, mc.MAX_LIFE, mc.MAX_FOOD, mc.MAX_BREATH, mc.MAX_XP) == (
        36,
        20,
        20,
        300,
        1395,
    )
    assert mc.MAX_ARMOR == 20 and mc.MAX_FOOD_SATURATION == 20.0
    assert mc.EQUIPMENT_SLOTS == ["mainhand", "offhand", "feet", "legs", "chest", "head"]


def test_open_ended_layout_and_spaces():
    env = minedojo.make("open-ended", image_size=(H, W), world_seed=1, seed=2)
    obs = env.reset()
    assert layout(obs) == EXPECTED_OBS
    assert list(obs) == [
        "rgb",
        "inventory",
        "equipment",
        "life_stats",
        "location_stats",
        "nearby_tools",
        "damage_source",
        "masks",
        "delta_inv",
    ]
    np.testing.assert_array_equal(env.action_space.nvec, [3, 3, 4, 25, 25, 8, 244, 36])
    np.testing.assert_array_equal(env.action_space.no_op(), NOOP)
    # the declared spaces agree with the observation leaf by leaf
    spaces = dict(flat_spaces(env.observation_space))
    leaves = dict(flat(obs))
    assert set(spaces) == set(leaves)
    for key, value in leaves.items():
        assert spaces[key].shape == value.shape, key
    assert env.observation_space["inventory"]["name"].contains(obs["inventory"]["name"])
    assert env.observation_space["rgb"].contains(obs["rgb"])
    assert set(obs["inventory"]["name"]) == {"air"}
    assert obs["equipment"]["max_durability"].tolist() == [-1.0] * 6
    obs, reward, done, info = env.step(NOOP)
    assert (reward, done) == (0.0, False) and isinstance(info, dict)
    assert layout(obs) == EXPECTED_OBS
    env.close()


def test_harvest_tasks_have_voxels_and_real_initial_inventory():
    env = minedojo.make("harvest_wool_with_shears_and_sheep", image_size=16)
    obs = env.reset()
    assert obs["rgb"].shape == (3, 16, 16)
    assert layout(obs) == {**EXPECTED_OBS, "rgb": ((3, 16, 16), "uint8"), "voxels": EXPECTED_VOXELS}
    assert obs["inventory"]["name"][0] == "shears" and obs["equipment"]["name"][0] == "shears"
    assert obs["inventory"]["max_durability"][0] == 238
    assert minedojo.make("harvest_milk", image_size=(8, 8)).reset()["voxels"][
        "block_name"
    ].shape == (
        3,
        3,
        3,
    )


def test_make_arguments_like_the_real_one():
    env = minedojo.make("Open-Ended", image_size=32, cam_interval=30)
    assert env.reset()["rgb"].shape == (3, 32, 32)
    np.testing.assert_array_equal(env.action_space.nvec[3:5], [13, 13])
    with pytest.raises(ValueError, match="Invalid task id"):
        minedojo.make("no_such_task", image_size=8)
    with pytest.raises(ValueError, match="Invalid task id"):
        minedojo.make("harvest_not_an_item", image_size=8)
    with pytest.raises(TypeError):
        minedojo.make("open-ended", image_size=8, not_a_kwarg=1)
    with pytest.raises(TypeError):
        minedojo.make("harvest_milk", image_size=8, target_names="wool")
    env = minedojo.make("harvest_8_cobblestone_somewhere", image_size=8)  # parsed from the id
    assert env._target[:2] == ("cobblestone", 8)


# ---------------------------------------------------------------------------- dynamics


def test_camera_movement_and_rgb():
    env = minedojo.make("open-ended", image_size=(H, W), world_seed="w", seed=0)
    obs0 = env.reset()
    pos0 = obs0["location_stats"]["pos"].copy()
    obs = env.step(act(pitch=13))[0]  # bin 13 -> +15 degrees
    assert obs["location_stats"]["pitch"][0] == 15.0
    assert not np.array_equal(obs["rgb"], obs0["rgb"])
    for _ in range(7):
        obs = env.step(act(pitch=13))[0]
    assert obs["location_stats"]["pitch"][0] == 120.0  # the stand-in does not clamp
    obs = env.step(act(pitch=4, yaw=18))[0]  # -120 pitch, +90 yaw
    assert obs["location_stats"]["pitch"][0] == 0.0 and obs["location_stats"]["yaw"][0] == 90.0
    rgb_before = obs["rgb"]
    obs = env.step(act(move=(1, 0, 0)))[0]  # forward at yaw 90 -> towards -x
    pos = obs["location_stats"]["pos"]
    assert pos[0] < pos0[0] and abs(pos[2] - pos0[2]) < 1e-4
    assert not np.array_equal(obs["rgb"], rgb_before)
    assert env.last_action.tolist() == act(move=(1, 0, 0)).tolist()


def test_masks_follow_inventory_through_harvest_craft_place():
    env = minedojo.make("open-ended", image_size=8, seed=3, world_seed=3, break_speed_multiplier=5)
    obs = env.reset()
    assert obs["masks"]["action_type"].tolist() == [True, True, False, True] + [False] * 4
    assert not obs["masks"]["craft_smelt"].any()
    assert_masks_consistent(obs)
    # two attack steps (10 / 5) break a block; the streak restarts after each harvest
    harvested = []
    for _ in range(40):
        obs, _, _, _ = env.step(act("attack"))
        assert_masks_consistent(obs)
        if obs["delta_inv"]["inc_quantity_by_other"][0] > 0:
            harvested.append(str(obs["delta_inv"]["inc_name_by_other"][0]))
        if count(obs, "log") >= 2:
            break
    assert env.steps % 2 == 0 and len(harvested) == env.steps // 2
    assert set(harvested) <= {"log", "dirt", "cobblestone"} and count(obs, "log") >= 2
    assert obs["masks"]["craft_smelt"][CRAFT["planks"]] and obs["masks"]["action_type"][FN["craft"]]
    assert obs["masks"]["action_type"][FN["drop"]]  # something is in the main hand now

    logs = count(obs, "log")
    obs, *_ = env.step(act("craft", craft=CRAFT["planks"]))
    assert count(obs, "log") == logs - 1 and count(obs, "planks") == 4
    assert obs["delta_inv"]["inc_name_by_craft"].tolist() == ["planks"]
    assert obs["delta_inv"]["dec_name_by_craft"][0] == "log"
    assert obs["masks"]["craft_smelt"][CRAFT["crafting_table"]]
    assert_masks_consistent(obs)

    obs, *_ = env.step(act("craft", craft=CRAFT["crafting_table"]))
    assert count(obs, "planks") == 0 and count(obs, "crafting table") == 1
    slot = int(np.flatnonzero(obs["inventory"]["name"] == "crafting table")[0])
    assert obs["masks"]["place"][slot] and not obs["nearby_tools"]["table"]
    table_only = slice(54, 54 + 170)
    assert not obs["masks"]["craft_smelt"][table_only].any()
    obs, *_ = env.step(act("place", slot=slot))
    assert obs["nearby_tools"]["table"] and obs["inventory"]["name"][slot] == "air"
    assert "crafting_table" in obs["delta_inv"]["dec_name_by_other"]
    assert_masks_consistent(obs)


def test_table_gating_equip_destroy_and_drop():
    inventory = [
        InventoryItem(slot=0, name="planks", quantity=20),
        InventoryItem(slot=1, name="stick", quantity=4),
        InventoryItem(slot=2, name="crafting_table", quantity=1),
        InventoryItem(slot=3, name="shield", quantity=1),
    ]
    env = minedojo.make("open-ended", image_size=8, seed=0, initial_inventory=inventory)
    obs = env.reset()
    pick = mc.ALL_CRAFT_SMELT_ITEMS.index("wooden_pickaxe")
    assert not obs["masks"]["craft_smelt"][pick]
    with pytest.raises(ValueError):
        env.step(act("craft", craft=pick))  # needs a table nearby
    obs, *_ = env.step(act("place", slot=2))
    assert obs["masks"]["craft_smelt"][pick]
    obs, *_ = env.step(act("craft", craft=pick))
    assert count(obs, "wooden pickaxe") == 1 and count(obs, "planks") == 17
    # equip swaps into the main hand; shields go to the off hand (equipment row 5)
    slot = int(np.flatnonzero(obs["inventory"]["name"] == "wooden pickaxe")[0])
    obs, *_ = env.step(act("equip", slot=slot))
    assert (
        obs["inventory"]["name"][0] == "wooden pickaxe"
        and obs["inventory"]["name"][slot] == "planks"
    )
    assert obs["equipment"]["name"][0] == "wooden pickaxe"
    assert not obs["masks"]["equip"][0]
    obs, *_ = env.step(act("equip", slot=3))
    assert obs["inventory"]["name"][3] == "air" and obs["equipment"]["name"][5] == "shield"
    obs, *_ = env.step(act("destroy", slot=1))
    assert obs["inventory"]["name"][1] == "air" and not obs["masks"]["destroy"][1]
    obs, *_ = env.step(act("drop"))
    assert obs["inventory"]["name"][0] == "air" and not obs["masks"]["action_type"][FN["drop"]]
    assert_masks_consistent(obs)


def test_strict_rejection_of_invalid_and_masked_actions():
    env = minedojo.make("open-ended", image_size=8, seed=0)
    with pytest.raises(RuntimeError):
        env.step(NOOP)  # before reset
    obs = env.reset()
    bad = [
        NOOP[:7],
        np.array([0, 0, 0, 25, 12, 0, 0, 0]),  # pitch bin out of range
        np.array([0, 0, 0, 12, 12, 8, 0, 0]),
        np.array([-1, 0, 0, 12, 12, 0, 0, 0]),
        NOOP.astype(np.float32),
        act("drop"),  # empty main hand
        act("craft", craft=CRAFT["planks"]),  # action type masked
        act("equip", slot=5),
        act("place", slot=5),
        act("destroy", slot=5),
    ]
    for action in bad:
        with pytest.raises(ValueError):
            env.step(action)
    assert env.steps == 0  # rejected actions do not advance the simulator
    np.testing.assert_array_equal(env.prev_obs["rgb"], obs["rgb"])
    env2 = minedojo.make(
        "open-ended",
        image_size=8,
        initial_inventory=[InventoryItem(slot=0, name="log", quantity=1)],
    )
    obs = env2.reset()
    with pytest.raises(ValueError):  # craft is valid, but not this recipe
        env2.step(act("craft", craft=CRAFT["crafting_table"]))
    with pytest.raises(ValueError):  # equip of a main-hand item already in the main hand
        env2.step(act("equip", slot=0))
    env2.step(act("craft", craft=CRAFT["planks"]))  # valid, accepted


def test_seed_determinism():
    def rollout(world_seed, seed):
        env = minedojo.make(
            "harvest_1_log",
            image_size=(H, W),
            world_seed=world_seed,
            seed=seed,
            break_speed_multiplier=10,
        )
        obs = env.reset()
        chooser = np.random.default_rng(0)
        trace = [obs]
        for _ in range(25):
            fn = int(chooser.choice(np.flatnonzero(obs["masks"]["action_type"])))
            a = act(
                list(FN)[fn], move=(int(chooser.integers(3)), 0, 0), yaw=int(chooser.integers(25))
            )
            if fn in (5, 6, 7):
                a[7] = chooser.choice(np.flatnonzero(obs["masks"][list(FN)[fn]]))
            if fn == 4:
                a[6] = chooser.choice(np.flatnonzero(obs["masks"]["craft_smelt"]))
            obs, reward, done, _ = env.step(a)
            trace.append(obs)
            if done:
                obs = env.reset()
        return trace

    a, b = rollout(5, 7), rollout(5, 7)
    for oa, ob in zip(a, b):
        for (ka, va), (kb, vb) in zip(flat(oa), flat(ob)):
            assert ka == kb
            np.testing.assert_array_equal(va, vb, err_msg=ka)
    c = rollout(5, 8)  # same world, other sim seed
    np.testing.assert_array_equal(a[0]["location_stats"]["pos"], c[0]["location_stats"]["pos"])
    assert any(
        not np.array_equal(x["inventory"]["name"], y["inventory"]["name"]) for x, y in zip(a, c)
    )
    d = rollout(6, 7)  # other world
    assert not np.array_equal(a[0]["location_stats"]["pos"], d[0]["location_stats"]["pos"])


def test_harvest_reward_done_and_fast_reset():
    env = minedojo.make(
        "harvest_wool_with_shears_and_sheep", image_size=8, seed=1, break_speed_multiplier=100
    )
    obs = env.reset()
    rewards = []
    for _ in range(60):
        obs, reward, done, info = env.step(act("attack"))
        rewards.append(reward)
        if done:
            break
    assert done and rewards[-1] == 1.0 and sum(rewards) == 1.0 and env.is_successful
    assert count(obs, "wool") == 1
    assert any(i["name"] == "wool" for i in info["inventory"])
    pos = obs["location_stats"]["pos"].copy()
    obs = env.reset()  # fast reset: inventory back to the task's initial one, agent teleported
    assert count(obs, "wool") == 0 and obs["inventory"]["name"][0] == "shears"
    assert not np.array_equal(obs["location_stats"]["pos"], pos) and not env.is_successful
    assert env.launches == 1 and env.resets == 2


def test_break_speed_multiplier_controls_attack_steps():
    def steps_to_first_item(mult):
        env = minedojo.make("open-ended", image_size=8, seed=0, break_speed_multiplier=mult)
        env.reset()
        for i in range(1, 50):
            obs, *_ = env.step(act("attack"))
            if (obs["inventory"]["name"] != "air").any():
                return i

    assert steps_to_first_item(1.0) == 10 and steps_to_first_item(4.0) == 3
    assert steps_to_first_item(100.0) == 1


# ---------------------------------------------------------------------------- process life cycle


def test_crash_file_is_claimed_by_exactly_one_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MINEDOJO_STANDIN_CRASH_DIR", str(tmp_path))
    envs = [minedojo.make("open-ended", image_size=8, seed=i) for i in range(2)]
    for env in envs:
        env.reset()
        env.step(NOOP)
    (tmp_path / "crash").write_text("")
    outcomes = []
    for env in envs:
        try:
            env.step(NOOP)
            outcomes.append("ok")
        except RuntimeError as e:
            assert "Minecraft process died" in str(e)
            outcomes.append("died")
    assert outcomes == ["died", "ok"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"crash.claimed.{os.getpid()}"]
    dead = envs[0]
    assert dead.crashed
    with pytest.raises(RuntimeError, match="died"):
        dead.step(NOOP)
    with pytest.raises(RuntimeError, match="died"):
        dead.reset()
    envs[1].step(NOOP)  # the survivor keeps going, no file left to claim
    dead.close()
    fresh = minedojo.make("open-ended", image_size=8, seed=0)
    fresh.reset()
    fresh.step(NOOP)


def test_crash_after_steps():
    env = minedojo.make("open-ended", image_size=8)
    env.reset()
    env.crash_after(2)
    env.step(NOOP)
    env.step(NOOP)
    with pytest.raises(RuntimeError, match="stand-in crash"):
        env.step(NOOP)
    with pytest.raises(RuntimeError):
        env.reset()
    env.close()
    env.reset()  # closed and relaunched: a new "process"
    assert env.launches == 2
    env.step(NOOP)
    env2 = minedojo.make("open-ended", image_size=8, standin_crash_after=0)
    env2.reset()
    with pytest.raises(RuntimeError):
        env2.step(NOOP)


def test_launch_log_written_once_per_launch(tmp_path, monkeypatch):
    log = tmp_path / "launch.log"
    monkeypatch.setenv("MINEDOJO_STANDIN_LOG", str(log))
    monkeypatch.setenv("MINEDOJO_STANDIN_LAUNCH_SECONDS", "0.05")
    env = minedojo.make("open-ended", image_size=8)
    assert env.launches == 0 and not log.exists()  # make() does not launch
    env.reset()
    env.step(NOOP)
    env.reset()  # no relaunch on later resets
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and env.launches == 1
    pid, start, end = lines[0].split()
    assert int(pid) == os.getpid() and float(end) - float(start) >= 0.05
