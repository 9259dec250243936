"""MineDojo adapter: ``minedojo.make(...)`` as a gymnasium env with masked multi-head actions.

Observations (N = len(ALL_ITEMS), MineDojo's item vocabulary):
  image (H, W, 3) uint8; inventory (N,) counts; inventory_max (N,) the episode's largest
  count of each item; equipped (N,) main-hand one-hot; life_stats (3,) life, food,
  oxygen scaled to [0, 1]; masks as 0/1 uint8: mask_action (19,), mask_craft (244,),
  mask_equip / mask_place / mask_destroy (N,) per item.
Actions, MultiDiscrete([19, 244, N]): a functional head (``FUNCTIONAL``), the craft /
smelt item (used by "craft"), and an inventory item (used by equip / place / destroy,
sent as the first slot holding it). ``action_heads`` tells the agent which masks apply.
Converted to MineDojo's native MultiDiscrete([3, 3, 4, 25, 25, 8, 244, 36]), with sticky
attack / jump and the camera pitch kept within ``pitch_limit`` degrees.

Launches (``make`` + first ``reset``) are serialised across processes by a file lock; a
simulator that raises is relaunched by ``dreamer.envs``'s ``Restarting`` wrapper.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import gymnasium
import numpy as np
from filelock import FileLock, Timeout
from gymnasium import spaces

from dreamer.agent.layout import Head
from dreamer.envs.restarts import EnvFatalError
from dreamer.errors import ConfigError

log = logging.getLogger(__name__)

FUNCTIONAL = (
    "noop",
    "forward",
    "back",
    "left",
    "right",
    "jump_forward",
    "sneak_forward",
    "sprint_forward",
    "pitch_up",
    "pitch_down",
    "yaw_left",
    "yaw_right",
    "use",
    "drop",
    "attack",
    "craft",
    "equip",
    "place",
    "destroy",
)
CRAFT, EQUIP, PLACE, DESTROY = (FUNCTIONAL.index(n) for n in ("craft", "equip", "place", "destroy"))
CAMERA_STEP = 15  # degrees per camera choice; MineDojo's cam_interval
NO_TURN = 12  # MineDojo's camera bin for "no change" (delta = bin * 15 - 180)
# native action indices
MOVE, STRAFE, JUMP_SNEAK_SPRINT, PITCH, YAW, FUNCTION, CRAFT_ARG, SLOT_ARG = range(8)
NATIVE_FUNCTIONS = ("noop", "use", "drop", "attack", "craft", "equip", "place", "destroy")
NATIVE_ATTACK, NATIVE_JUMP = NATIVE_FUNCTIONS.index("attack"), 1
# functional choice -> (native index, value) pairs
_NATIVE = {
    "forward": ((MOVE, 1),),
    "back": ((MOVE, 2),),
    "left": ((STRAFE, 1),),
    "right": ((STRAFE, 2),),
    "jump_forward": ((MOVE, 1), (JUMP_SNEAK_SPRINT, 1)),
    "sneak_forward": ((MOVE, 1), (JUMP_SNEAK_SPRINT, 2)),
    "sprint_forward": ((MOVE, 1), (JUMP_SNEAK_SPRINT, 3)),
    "pitch_up": ((PITCH, NO_TURN - 1),),
    "pitch_down": ((PITCH, NO_TURN + 1),),
    "yaw_left": ((YAW, NO_TURN - 1),),
    "yaw_right": ((YAW, NO_TURN + 1),),
    **{name: ((FUNCTION, NATIVE_FUNCTIONS.index(name)),) for name in NATIVE_FUNCTIONS[1:]},
}


class MineDojoLaunchError(EnvFatalError):
    pass


def normalise(name: str) -> str:
    """MineDojo's inventory says "crafting table"; its vocabulary says "crafting_table"."""
    return str(name).strip().replace(" ", "_")


@dataclass(frozen=True)
class Vocabulary:
    items: tuple[str, ...]  # ALL_ITEMS
    craft_items: tuple[str, ...]  # ALL_CRAFT_SMELT_ITEMS

    @functools.cached_property
    def _lookup(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.items)}

    def index(self, name: str) -> int | None:
        return self._lookup.get(normalise(name))

    def slot_items(self, names) -> np.ndarray:
        """Each inventory slot's item index; -1 for an empty slot ("air") or unknown name."""
        found = [self._lookup.get(normalise(name), -1) for name in names]
        return np.where(np.asarray([normalise(n) == "air" for n in names]), -1, found)


def inventory_counts(slots: np.ndarray, quantities, size: int) -> np.ndarray:
    """Item counts over the vocabulary from ``slot_items`` and the slots' quantities."""
    counts = np.zeros(size, np.float32)
    held = slots >= 0
    np.add.at(counts, slots[held], np.asarray(quantities, np.float32).reshape(-1)[held])
    return counts


def equipped_one_hot(main_hand: str, vocab: Vocabulary) -> np.ndarray:
    one_hot = np.zeros(len(vocab.items), np.float32)
    (index,) = vocab.slot_items([main_hand])
    if index >= 0:
        one_hot[index] = 1.0
    return one_hot


def life_stats(stats: dict, max_life: float, max_food: float, max_breath: float) -> np.ndarray:
    """Life, food and oxygen scaled to about [0, 1]."""
    values = (
        float(np.asarray(stats["life"]).reshape(-1)[0]) / max_life,
        float(np.asarray(stats["food"]).reshape(-1)[0]) / max_food,
        float(np.asarray(stats["oxygen"]).reshape(-1)[0]) / max_breath,
    )
    return np.asarray(values, np.float32)


def item_mask(slots: np.ndarray, slot_mask, size: int) -> np.ndarray:
    """An item is valid when some slot holding it is valid in MineDojo's per-slot mask."""
    mask = np.zeros(size, np.uint8)
    mask[slots[(slots >= 0) & np.asarray(slot_mask, bool).reshape(-1)]] = 1
    return mask


def action_mask(action_type) -> np.ndarray:
    """The functional head's mask from MineDojo's 8 native ones (moves: always valid)."""
    action_type = np.asarray(action_type, bool).reshape(-1)
    mask = np.ones(len(FUNCTIONAL), np.uint8)
    for native, name in enumerate(NATIVE_FUNCTIONS[1:], start=1):
        mask[FUNCTIONAL.index(name)] = action_type[native]
    return mask


def observation(native: dict, slots: np.ndarray, vocab: Vocabulary, limits) -> dict:
    """MineDojo's observation -> ours without ``inventory_max``; ``slots``: ``slot_items``."""
    masks, size = native["masks"], len(vocab.items)
    return {
        "image": np.ascontiguousarray(np.asarray(native["rgb"], np.uint8).transpose(1, 2, 0)),
        "inventory": inventory_counts(slots, native["inventory"]["quantity"], size),
        "equipped": equipped_one_hot(np.asarray(native["equipment"]["name"]).reshape(-1)[0], vocab),
        "life_stats": life_stats(native["life_stats"], *limits),
        "mask_action": action_mask(masks["action_type"]),
        "mask_craft": np.asarray(masks["craft_smelt"], np.uint8).reshape(-1),
        "mask_equip": item_mask(slots, masks["equip"], size),
        "mask_place": item_mask(slots, masks["place"], size),
        "mask_destroy": item_mask(slots, masks["destroy"], size),
    }


def slot_of(item: int, slots: np.ndarray, slot_mask, vocab: Vocabulary) -> int:
    """The first inventory slot that holds ``item`` and is valid in ``slot_mask``."""
    found = np.flatnonzero((slots == item) & np.asarray(slot_mask, bool).reshape(-1))
    if not found.size:
        raise ValueError(f"no valid inventory slot holds item {vocab.items[item]!r}")
    return int(found[0])


SLOT_MASKS = {EQUIP: "equip", PLACE: "place", DESTROY: "destroy"}


def to_native(action, slots: np.ndarray, masks: dict, vocab: Vocabulary) -> np.ndarray:
    """Our (functional, craft item, item) action -> MineDojo's 8-dim native action."""
    function, craft_item, item = (int(a) for a in action)
    native = np.array([0, 0, 0, NO_TURN, NO_TURN, 0, 0, 0], np.int64)
    for index, value in _NATIVE.get(FUNCTIONAL[function], ()):
        native[index] = value
    if function == CRAFT:
        native[CRAFT_ARG] = craft_item
    if function in SLOT_MASKS:
        native[SLOT_ARG] = slot_of(item, slots, masks[SLOT_MASKS[function]], vocab)
    return native


def _hold(native: np.ndarray, index: int, value: int, length: int, left: int) -> int:
    """Keep ``native[index] = value`` while the agent leaves it at 0; returns steps left."""
    if native[index] == value:
        return length
    if native[index] == 0 and left > 0:
        native[index] = value
        return left - 1
    return 0


@dataclass
class Sticky:
    """Sticky attack and jump: the ``attack`` (``jump``) steps after one keep it up unless
    the agent picks another native function (another of jump / sneak / sprint)."""

    attack: int
    jump: int
    attack_left: int = 0
    jump_left: int = 0

    def apply(self, native: np.ndarray) -> np.ndarray:
        native = native.copy()
        self.attack_left = _hold(native, FUNCTION, NATIVE_ATTACK, self.attack, self.attack_left)
        self.jump_left = _hold(native, JUMP_SNEAK_SPRINT, NATIVE_JUMP, self.jump, self.jump_left)
        return native

    def reset(self) -> None:
        self.attack_left = self.jump_left = 0


def limit_pitch(native: np.ndarray, pitch: float, limit: float) -> np.ndarray:
    """Drop a pitch change that would take the camera beyond +-``limit`` degrees."""
    delta = (int(native[PITCH]) - NO_TURN) * CAMERA_STEP
    if delta and abs(pitch + delta) > limit:
        native = native.copy()
        native[PITCH] = NO_TURN
    return native


def action_heads(vocab: Vocabulary) -> tuple[Head, ...]:
    return (
        Head(len(FUNCTIONAL), mask="mask_action"),
        Head(len(vocab.craft_items), gated_by=((CRAFT, "mask_craft"),)),
        Head(
            len(vocab.items),
            gated_by=((EQUIP, "mask_equip"), (PLACE, "mask_place"), (DESTROY, "mask_destroy")),
        ),
    )


META_TASKS = ("open-ended", "harvest", "combat", "techtree", "survival")


def check_task(task: str) -> None:
    """Unknown task ids fail here, in the driver, not later in every worker."""
    from minedojo.tasks import ALL_TASK_IDS

    if task in ALL_TASK_IDS or task.lower() in META_TASKS or task.startswith("creative:"):
        return
    raise ConfigError(
        f"env.task: unknown MineDojo task {task!r}; allowed: the ids in "
        f"minedojo.tasks.ALL_TASK_IDS (e.g. harvest_milk), creative:<n>, {', '.join(META_TASKS)}"
    )


def default_lock() -> str:
    return str(Path(tempfile.gettempdir()) / "dreamer-minedojo-launch.lock")


class MineDojoEnv(gymnasium.Env):
    """One MineDojo simulator behind the gymnasium API (see the module docstring)."""

    def __init__(
        self,
        task: str,
        image_size: int = 64,
        world_seed: int = 0,
        seed: int = 0,
        break_speed: float = 100.0,
        sticky_attack: int = 30,
        sticky_jump: int = 10,
        pitch_limit: float = 60.0,
        max_steps: int = 0,
        fast_reset: bool = True,
        milestone_reward: bool = False,
        launch_lock: str | None = None,
        launch_timeout: float = 600.0,
    ) -> None:
        import minedojo
        from minedojo.sim.mc_meta import mc

        check_task(task)
        self._minedojo = minedojo
        self.vocab = Vocabulary(tuple(mc.ALL_ITEMS), tuple(mc.ALL_CRAFT_SMELT_ITEMS))
        self._limits = (float(mc.MAX_LIFE), float(mc.MAX_FOOD), float(mc.MAX_BREATH))
        self._make_kwargs = dict(
            task_id=task,
            image_size=(image_size, image_size),
            world_seed=world_seed,
            seed=seed,
            fast_reset=fast_reset,
            break_speed_multiplier=break_speed,
        )
        self._sticky = Sticky(sticky_attack, sticky_jump)
        self._pitch_limit = pitch_limit
        self._max_steps = max_steps
        self._milestones = milestone_reward
        self._lock = FileLock(launch_lock or default_lock())
        self._launch_timeout = launch_timeout
        self._sim = None
        self._native_obs: dict | None = None

        n = len(self.vocab.items)
        vector = lambda size: spaces.Box(0, np.inf, (size,), np.float32)  # noqa: E731
        binary = lambda size: spaces.Box(0, 1, (size,), np.uint8)  # noqa: E731
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (image_size, image_size, 3), np.uint8),
                "inventory": vector(n),
                "inventory_max": vector(n),
                "equipped": spaces.Box(0, 1, (n,), np.float32),
                "life_stats": spaces.Box(0, np.inf, (3,), np.float32),
                "mask_action": binary(len(FUNCTIONAL)),
                "mask_craft": binary(len(self.vocab.craft_items)),
                "mask_equip": binary(n),
                "mask_place": binary(n),
                "mask_destroy": binary(n),
            }
        )
        self.action_space = spaces.MultiDiscrete([len(FUNCTIONAL), len(self.vocab.craft_items), n])
        self.action_heads = action_heads(self.vocab)

    def _launch(self) -> dict:
        """Make and reset a simulator (Java starts there), one process at a time."""
        try:
            with self._lock.acquire(timeout=self._launch_timeout):
                sim = self._minedojo.make(**self._make_kwargs)
                try:
                    native = sim.reset()
                except BaseException:
                    with contextlib.suppress(Exception):
                        sim.close()
                    raise
        except Timeout:
            raise MineDojoLaunchError(
                f"env: waited {self._launch_timeout:.0f} s for the MineDojo launch lock "
                f"{self._lock.lock_file}; another process holds it (raise env.launch_timeout)"
            ) from None
        self._sim = sim
        return native

    def _start_episode(self, native: dict) -> dict:
        self._sticky.reset()
        self._steps = 0
        obs = self._convert(native)
        self._inventory_max = obs["inventory"].copy()
        self._seen = obs["inventory"] > 0
        obs["inventory_max"] = self._inventory_max.copy()
        return obs

    def _convert(self, native: dict) -> dict:
        self._native_obs = native
        self._slots = self.vocab.slot_items(np.asarray(native["inventory"]["name"]).reshape(-1))
        return observation(native, self._slots, self.vocab, self._limits)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        native = self._launch() if self._sim is None else self._sim.reset()
        return self._start_episode(native), {}

    def step(self, action):
        native_obs = self._native_obs
        native = to_native(action, self._slots, native_obs["masks"], self.vocab)
        native = self._sticky.apply(native)
        pitch = float(np.asarray(native_obs["location_stats"]["pitch"]).reshape(-1)[0])
        native = limit_pitch(native, pitch, self._pitch_limit)
        result, reward, done, _ = self._sim.step(native)
        obs = self._convert(result)
        self._steps += 1
        np.maximum(self._inventory_max, obs["inventory"], out=self._inventory_max)
        obs["inventory_max"] = self._inventory_max.copy()
        reward = float(reward)
        if self._milestones:
            new = (obs["inventory"] > 0) & ~self._seen
            reward += float(new.sum())
            self._seen |= new
        truncated = bool(self._max_steps) and self._steps >= self._max_steps and not done
        return obs, reward, bool(done), truncated, {}

    def close(self) -> None:
        sim, self._sim = self._sim, None
        if sim is not None:
            with contextlib.suppress(Exception):
                sim.close()


def make(env, seed: int) -> MineDojoEnv:
    return MineDojoEnv(
        task=env["task"],
        image_size=env["image_size"],
        world_seed=env["world_seed"],
        seed=seed,
        break_speed=env["break_speed"],
        sticky_attack=env["sticky_attack"],
        sticky_jump=env["sticky_jump"],
        pitch_limit=env["pitch_limit"],
        max_steps=env["max_steps"],
        fast_reset=env["fast_reset"],
        milestone_reward=env["milestone_reward"],
        launch_lock=env.get("launch_lock"),
        launch_timeout=env["launch_timeout"],
    )
