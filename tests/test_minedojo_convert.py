"""The MineDojo adapter's pure conversions, sticky actions and pitch limit."""

import numpy as np
import pytest

from dreamer.envs.minedojo import (
    CRAFT,
    EQUIP,
    FUNCTIONAL,
    NO_TURN,
    PITCH,
    PLACE,
    Sticky,
    Vocabulary,
    action_mask,
    equipped_one_hot,
    inventory_counts,
    item_mask,
    life_stats,
    limit_pitch,
    normalise,
    observation,
    slot_of,
    to_native,
)

VOCAB = Vocabulary(
    items=("air", "cobblestone", "crafting_table", "diamond", "log", "stick"),
    craft_items=("crafting_table", "stick", "wooden_pickaxe"),
)
EMPTY = np.array(["air"] * 36, dtype=object)


def counts(names, quantities) -> np.ndarray:
    return inventory_counts(VOCAB.slot_items(names), quantities, len(VOCAB.items))


def inventory(*slots: tuple[str, float]) -> tuple[np.ndarray, np.ndarray]:
    names, quantities = EMPTY.copy(), np.zeros(36, np.float32)
    for slot, (name, quantity) in enumerate(slots):
        names[slot], quantities[slot] = name, quantity
    return names, quantities


def test_names_with_spaces_match_the_vocabulary():
    assert normalise("crafting table") == "crafting_table"
    assert VOCAB.index("crafting table") == 2 and VOCAB.index("no such item") is None


def test_inventory_counts():
    assert not counts(*inventory()).any()  # empty: all "air"
    names, quantities = inventory(("log", 3), ("crafting table", 1), ("log", 5), ("unobtainium", 9))
    held = counts(names, quantities)
    assert held.tolist() == [0, 0, 1, 0, 8, 0]  # stacks summed, unknown names skipped
    full = inventory(*[("cobblestone", 64)] * 36)
    assert counts(*full)[1] == 36 * 64


def test_equipped_and_life_stats():
    assert equipped_one_hot("diamond", VOCAB).tolist() == [0, 0, 0, 1, 0, 0]
    assert not equipped_one_hot("air", VOCAB).any() and not equipped_one_hot("?", VOCAB).any()
    stats = {"life": np.array([10.0]), "food": np.array([20.0]), "oxygen": np.array([150.0])}
    assert life_stats(stats, 20, 20, 300).tolist() == [0.5, 1.0, 0.5]


def test_action_mask_all_false_but_noop():
    mask = action_mask([True, False, False, False, False, False, False, False])
    valid = {FUNCTIONAL[i] for i in np.flatnonzero(mask)}
    assert valid == set(FUNCTIONAL[:12])  # noop, movement and camera only
    assert action_mask([True] * 8).all()


def test_item_masks_and_slots_round_trip():
    names, _ = inventory(("log", 3), ("stick", 2), ("log", 1), ("diamond", 1))
    slot_mask = np.array([False, True, True, True] + [False] * 32)
    slots = VOCAB.slot_items(names)
    mask = item_mask(slots, slot_mask, len(VOCAB.items))
    assert {VOCAB.items[i] for i in np.flatnonzero(mask)} == {"log", "stick", "diamond"}
    for item in np.flatnonzero(mask):
        slot = slot_of(item, slots, slot_mask, VOCAB)
        assert slot_mask[slot] and VOCAB.index(names[slot]) == item
    assert slot_of(VOCAB.index("log"), slots, slot_mask, VOCAB) == 2  # slot 0 holds log, masked
    with pytest.raises(ValueError, match="cobblestone"):
        slot_of(VOCAB.index("cobblestone"), slots, slot_mask, VOCAB)


def test_to_native():
    names, _ = inventory(("log", 3), ("stick", 2))
    slots = VOCAB.slot_items(names)
    masks = {k: np.array([True, True] + [False] * 34) for k in ("equip", "place", "destroy")}
    native = to_native([FUNCTIONAL.index("jump_forward"), 2, 5], slots, masks, VOCAB)
    assert native.tolist() == [1, 0, 1, NO_TURN, NO_TURN, 0, 0, 0]
    assert to_native([CRAFT, 2, 5], slots, masks, VOCAB).tolist()[5:] == [4, 2, 0]
    assert to_native([EQUIP, 0, VOCAB.index("stick")], slots, masks, VOCAB).tolist()[5:] == [
        5,
        0,
        1,
    ]
    assert to_native([PLACE, 1, VOCAB.index("log")], slots, masks, VOCAB).tolist()[5:] == [6, 0, 0]
    yaw_left = to_native([FUNCTIONAL.index("yaw_left"), 0, 0], slots, masks, VOCAB)
    assert yaw_left[4] * 15 - 180 == -15


def test_observation_images_are_channels_last():
    rgb = np.random.default_rng(0).integers(0, 255, (3, 8, 10), dtype=np.uint8)
    names, quantities = inventory(("log", 1))
    native = {
        "rgb": rgb,
        "inventory": {"name": names, "quantity": quantities},
        "equipment": {"name": np.array(["log", "air", "air", "air", "air", "air"])},
        "life_stats": {"life": [20.0], "food": [20.0], "oxygen": [300.0]},
        "masks": {
            "action_type": np.ones(8, bool),
            "craft_smelt": np.array([True, False, True]),
            "equip": np.ones(36, bool),
            "place": np.zeros(36, bool),
            "destroy": np.ones(36, bool),
        },
    }
    obs = observation(native, VOCAB.slot_items(names), VOCAB, (20, 20, 300))
    assert obs["image"].shape == (8, 10, 3) and (obs["image"][2, 3] == rgb[:, 2, 3]).all()
    assert obs["mask_craft"].tolist() == [1, 0, 1]
    assert obs["mask_equip"].tolist() == [0, 0, 0, 0, 1, 0] and not obs["mask_place"].any()


def native(function: int = 0, jump: int = 0) -> np.ndarray:
    return np.array([0, 0, jump, NO_TURN, NO_TURN, function, 0, 0])


def test_sticky_attack_and_jump():
    sticky = Sticky(attack=3, jump=2)
    functions = [sticky.apply(native(3))[5]] + [sticky.apply(native())[5] for _ in range(5)]
    assert functions == [3, 3, 3, 3, 0, 0]  # the attack, then 3 sticky steps
    sticky.apply(native(3))
    assert sticky.apply(native(4))[5] == 4 and sticky.apply(native())[5] == 0  # craft cancels
    jumps = [sticky.apply(native(jump=1))[2]] + [sticky.apply(native())[2] for _ in range(3)]
    assert jumps == [1, 1, 1, 0]
    sticky.apply(native(jump=1))
    assert sticky.apply(native(jump=3))[2] == 3 and sticky.apply(native())[2] == 0  # sprint
    sticky.apply(native(3))
    sticky.reset()
    assert sticky.apply(native())[5] == 0


def test_pitch_stays_within_the_limit():
    pitch, seen = 0.0, []
    for step in [NO_TURN + 1] * 6 + [NO_TURN - 1] * 12:
        action = native()
        action[PITCH] = step
        action = limit_pitch(action, pitch, 60)
        pitch += (action[PITCH] - NO_TURN) * 15
        seen.append(pitch)
    assert max(seen) == 60 and min(seen) == -60
    assert seen[:5] == [15, 30, 45, 60, 60]
