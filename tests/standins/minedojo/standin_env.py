"""The stand-in simulator behind ``minedojo.make`` (test fixture, not part of real MineDojo).

``StandinEnv`` mimics what ``minedojo.make(...)`` returns in MineDojo 0.1: a MineDojoSim (or a
HarvestMeta task) wrapped by ``ARNNWrapper`` -- old gym API, MultiDiscrete([3,3,4,P,Y,8,244,36])
actions, dict observations with ``masks`` (ARMasksWrapper rules) and ``delta_inv``.  The world is
a deterministic toy: no Java, no blocks except the ones the agent places.

Things a test can use that the real env does not have:

* attributes ``launches``, ``resets``, ``steps``, ``last_action``, ``crashed``, ``closed``;
* ``crash_after(n)`` / ``make(..., standin_crash_after=n)``: the next ``n`` steps succeed and
  the one after raises like a dying Minecraft process;
* env var ``MINEDOJO_STANDIN_CRASH_DIR``: a file ``crash`` there is claimed (atomic rename to
  ``crash.claimed.<pid>``) by the first ``step()`` of any env that sees it, which then dies;
* env vars ``MINEDOJO_STANDIN_LAUNCH_SECONDS`` (default 0.2) and ``MINEDOJO_STANDIN_LOG``: the
  simulated Java launch on the first ``reset()`` sleeps that long and appends
  ``"<pid> <start> <end>\\n"`` to the log file.
"""

from __future__ import annotations

import math
import os
import secrets
import time
import zlib

import numpy as np

from .sim import spaces
from .sim.inventory import EQUIP_SLOTS
from .sim.mc_meta import mc

CRASH_MESSAGE = "Minecraft process died (stand-in crash)"
BASE_BREAK_STEPS = 10  # consecutive attack steps to break a block at break_speed_multiplier=1
NEARBY_DISTANCE = 5.0  # Malmo: squared distance <= 25 from the head
WALK_PER_STEP = 0.216  # blocks per tick (4.317 blocks/s)
N_SLOTS_TOTAL = 41  # 0..35 inventory (0..8 hotbar, 0 = main hand), 36..39 armour, 40 off hand
EQUIPMENT_ORDER = [0, 36, 37, 38, 39, 40]  # obs["equipment"] rows: main hand, feet, legs, ...
HARVEST_POOL = ["log", "dirt", "cobblestone"]
FN_NAMES = ["no_op", "use", "drop", "attack", "craft", "equip", "place", "destroy"]
N_FN = len(FN_NAMES)
_ACTION_ARG = np.array([[0], [0], [0], [0], [1], [1], [1], [1]], dtype=bool)
_VOXEL_KEYS = [
    "block_name",
    "block_meta",
    "is_collidable",
    "is_tool_not_required",
    "blocks_movement",
    "is_liquid",
    "is_solid",
    "can_burn",
    "blocks_light",
    "cos_look_vec_angle",
]

_ITEM_INDEX = {name: i for i, name in enumerate(mc.ALL_ITEMS)}
_ALL_ITEMS_ARR = np.array(mc.ALL_ITEMS)
_RECIPE_MATRIX = np.zeros((len(mc.ALL_CRAFT_SMELT_ITEMS), len(mc.ALL_ITEMS)), dtype=np.int64)
for _row, _out in enumerate(mc.ALL_CRAFT_SMELT_ITEMS):
    for _ing, _n in mc.RECIPES[_out][0].items():
        _RECIPE_MATRIX[_row, _ITEM_INDEX[_ing]] += _n
_N_HAND = len(mc.ALL_HAND_CRAFT_ITEMS_NN_ACTIONS)
_N_TABLE = len(mc.ALL_TABLE_CRAFT_ONLY_ITEMS_NN_ACTIONS)
_N_SMELT = len(mc.ALL_SMELT_ITEMS_NN_ACTIONS)
_PLACEABLE = set(mc.PLACEABLE_ITEM_NAMES)  # spaced names
_NON_MAINHAND = set(mc.NON_MAINHAND_ITEM_NAMES)  # spaced names
_BURNABLE = {"log", "log2", "planks", "crafting_table", "chest", "bookshelf"}


def _key(x) -> int:
    """A stable non-negative integer for a seed (int or str)."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x) & (2**63 - 1)
    return zlib.crc32(str(x).encode())


def _inventory_space(n: int) -> spaces.Dict:
    return spaces.Dict(
        {
            "name": spaces.Text((n,)),
            "variant": spaces.MultiDiscrete([121] * n),
            "quantity": spaces.Box(0, 64, (n,), np.float32),
            "max_durability": spaces.Box(-1, np.inf, (n,), np.float32),
            "cur_durability": spaces.Box(-1, np.inf, (n,), np.float32),
        }
    )


def _f1(low, high) -> spaces.Box:
    return spaces.Box(low, high, (1,), np.float32)


def _b0() -> spaces.Box:
    return spaces.Box(0, 1, (), bool)


def build_observation_space(
    image_size: tuple[int, int], voxel_grid: tuple[int, int, int] | None
) -> spaces.Dict:
    """The observation space of the ARNN-wrapped env, key for key (gymnasium spaces)."""
    h, w = image_size
    base = {
        "rgb": spaces.Box(0, 255, (3, h, w), np.uint8),
        "inventory": _inventory_space(mc.N_INV_SLOTS),
        "equipment": _inventory_space(6),
        "life_stats": spaces.Dict(
            {
                "life": _f1(0, mc.MAX_LIFE),
                "armor": _f1(0, mc.MAX_ARMOR),
                "food": _f1(0, mc.MAX_FOOD),
                "saturation": _f1(0, mc.MAX_FOOD_SATURATION),
                "xp": _f1(0, mc.MAX_XP),
                "oxygen": _f1(0, mc.MAX_BREATH),
                "is_sleeping": spaces.Discrete(2),
            }
        ),
        "location_stats": spaces.Dict(
            {
                "sun_brightness": _f1(0.0, 1.0),
                "sky_light_level": _f1(0.0, 1.0),
                "light_level": _f1(0.0, 15),
                "can_see_sky": spaces.Box(0, 1, (), np.int64),
                "rainfall": _f1(0.0, 1.0),
                "temperature": _f1(0.0, 1.0),
                "is_raining": spaces.Box(0, 1, (), np.int64),
                "biome_id": spaces.Box(0, 167, (), np.int64),
                "pitch": _f1(-180.0, 180.0),
                "yaw": _f1(-180.0, 180.0),
                "sea_level": _f1(0.0, 255),
                "pos": spaces.Box(-640000.0, 640000.0, (3,), np.float32),
            }
        ),
        "nearby_tools": spaces.Dict({"table": _b0(), "furnace": _b0()}),
        "damage_source": spaces.Dict(
            {
                "damage_amount": _f1(0.0, 40.0),
                "damage_distance": _f1(0.0, np.inf),
                "damage_pitch": _f1(-90, 90),
                "damage_yaw": _f1(-180, 180),
                "hunger_damage": _f1(0, 20),
                "is_explosion": _b0(),
                "is_fire_damage": _b0(),
                "is_magic_damage": _b0(),
                "is_projectile": _b0(),
                "is_unblockable": _b0(),
            }
        ),
    }
    if voxel_grid is not None:
        g = voxel_grid
        vox = {k: spaces.Box(0, 1, g, bool) for k in _VOXEL_KEYS[2:-1]}
        vox["block_name"] = spaces.Text(g)
        vox["block_meta"] = spaces.Box(0, 120, g, np.int64)
        vox["cos_look_vec_angle"] = spaces.Box(-1, 1, g, np.float32)
        base["voxels"] = spaces.Dict(vox)
    space = spaces.Dict(base)  # gymnasium sorts plain-dict keys, as gym 0.21 did
    space["masks"] = spaces.Dict(
        {
            "action_type": spaces.Box(0, 1, (N_FN,), bool),
            "action_arg": spaces.Box(0, 1, (N_FN, 1), bool),
            "equip": spaces.Box(0, 1, (mc.N_INV_SLOTS,), bool),
            "place": spaces.Box(0, 1, (mc.N_INV_SLOTS,), bool),
            "destroy": spaces.Box(0, 1, (mc.N_INV_SLOTS,), bool),
            "craft_smelt": spaces.Box(0, 1, (len(mc.ALL_CRAFT_SMELT_ITEMS),), bool),
        }
    )
    delta = {}
    for kind in ("craft", "other"):
        for sign, n in (("inc", 1), ("dec", 4)):
            delta[f"{sign}_name_by_{kind}"] = spaces.Text((n,))
            delta[f"{sign}_quantity_by_{kind}"] = spaces.Box(0, 64, (n,), np.float32)
    space["delta_inv"] = spaces.Dict(delta)
    return space


class StandinEnv:
    """A toy MineDojo task behind MineDojo 0.1's ARNNWrapper interface (old gym API)."""

    metadata = {"render.modes": []}
    reward_range = (-float("inf"), float("inf"))

    def __init__(
        self,
        task_id: str,
        *,
        image_size: tuple[int, int],
        world_seed=None,
        seed=None,
        fast_reset: bool = True,
        fast_reset_random_teleport_range: int | None = None,
        break_speed_multiplier: float = 1.0,
        cam_interval: float = 15,
        target: tuple[str, int, float] | None = None,
        initial_inventory: list[tuple[int, str, int, int]] | None = None,
        voxel_limits: tuple[tuple[int, int], ...] | None = None,
        start_position: dict | None = None,
        start_health: float | None = None,
        start_food: float | None = None,
        standin_crash_after: int | None = None,
    ):
        if break_speed_multiplier <= 0:
            raise ValueError("break_speed_multiplier must be > 0")
        if cam_interval <= 0:
            raise ValueError("cam_interval must be > 0")
        self.task_id = task_id
        self.cam_interval = cam_interval
        self.image_size = tuple(int(s) for s in image_size)
        self.break_speed_multiplier = float(break_speed_multiplier)
        self.fast_reset = bool(fast_reset)
        tp = 200 if fast_reset_random_teleport_range is None else fast_reset_random_teleport_range
        self._teleport_range = int(tp)
        self._target = target  # (item name, quantity, reward weight) for harvest tasks
        self._initial_inventory = list(initial_inventory or [])
        self._voxel_limits = voxel_limits
        grid = None
        if voxel_limits is not None:
            grid = tuple(1 + hi - lo for lo, hi in voxel_limits)
        self._start_position = start_position
        self._start_health = float(start_health or mc.MAX_LIFE)
        self._start_food = float(start_food or mc.MAX_FOOD)

        n_bins = math.ceil(360 / cam_interval) + 1
        self.action_space = spaces.MultiDiscrete(
            [3, 3, 4, n_bins, n_bins, N_FN, len(mc.ALL_CRAFT_SMELT_ITEMS), mc.N_INV_SLOTS],
            noop_vec=[0, 0, 0, (n_bins - 1) // 2, (n_bins - 1) // 2, 0, 0, 0],
        )
        self.observation_space = build_observation_space(self.image_size, grid)

        # seeding: the world depends on world_seed only, the sim on (world_seed, seed);
        # None means "random", as in MineDojo (an empty world seed is a random world too)
        self._world_key = _key(world_seed) if world_seed not in (None, "") else secrets.randbits(63)
        self._sim_key = _key(seed) if seed is not None else secrets.randbits(63)
        world_rng = np.random.default_rng([self._world_key, 1])
        self._spawn = np.array(
            [
                world_rng.uniform(-1000, 1000),
                64.0 + world_rng.integers(0, 8),
                world_rng.uniform(-1000, 1000),
            ]
        )
        self._biome_id = int(world_rng.choice([1, 3, 4, 5, 6, 21, 27]))
        self._sky = world_rng.integers(90, 200, size=3)
        self._ground = world_rng.integers(50, 150, size=3)
        self._rng = np.random.default_rng([self._world_key, self._sim_key])

        # bookkeeping visible to tests
        self.launches = 0
        self.resets = 0
        self.steps = 0
        self.last_action: np.ndarray | None = None
        self.crashed = False
        self.closed = False
        self._launched = False
        self._crash_countdown = standin_crash_after
        self._world_made = False

        self._obs = None
        self._info = None
        self._masks = None
        self._is_successful = False

    # ------------------------------------------------------------------ gym-like API
    @property
    def unwrapped(self):
        return self

    @property
    def is_successful(self) -> bool:
        return self._is_successful

    @property
    def prev_obs(self):
        return self._obs

    @property
    def prev_info(self):
        return self._info

    def seed(self, seed=None):
        """Reseed the simulator RNG (MineDojoSim.seed); the world stays the same."""
        self._sim_key = _key(seed) if seed is not None else secrets.randbits(63)
        self._rng = np.random.default_rng([self._world_key, self._sim_key])
        return [seed]

    def crash_after(self, n_steps: int) -> None:
        """The next ``n_steps`` steps succeed; the one after dies like a killed Java process."""
        self._crash_countdown = int(n_steps)

    def close(self) -> None:
        self.closed = True
        self.crashed = False
        self._launched = False
        self._world_made = False  # the next launch generates a fresh world
        self._obs = None
        self._masks = None

    def reset(self):
        if self.crashed:
            raise RuntimeError(CRASH_MESSAGE)
        if not self._launched:
            self._launch()
        self.closed = False
        if not self._world_made or not self.fast_reset:
            # a fresh world: spawn point, nothing placed
            self._world_made = True
            self._placed: list[tuple[str, np.ndarray]] = []
            self._pos = self._spawn.copy()
            self._yaw, self._pitch = 0.0, 0.0
            if self._start_position is not None:
                sp = self._start_position
                self._pos = np.array([sp["x"], sp["y"], sp["z"]], dtype=np.float64)
                self._yaw, self._pitch = float(sp["yaw"]), float(sp["pitch"])
        else:
            # fast reset: /kill (inventory lost), /spreadplayers, the world is kept
            r = self._teleport_range
            offset = self._rng.integers(-r, r + 1, size=2) if r > 0 else np.zeros(2)
            self._pos = self._pos + np.array([offset[0], 0.0, offset[1]])
            self._yaw, self._pitch = 0.0, 0.0
        self._names = ["air"] * N_SLOTS_TOTAL
        self._qty = np.zeros(N_SLOTS_TOTAL, dtype=np.int64)
        self._dur = np.full(N_SLOTS_TOTAL, -1.0)
        for slot, name, quantity, _variant in self._initial_inventory:
            self._set_slot(slot, name, quantity)
        self._life, self._food = self._start_health, self._start_food
        self._attack_streak = 0
        self._is_successful = False
        self.resets += 1
        self._ini_target = self._target_count()
        obs = self._observe(delta=None)
        self._info = self._make_info()
        return obs

    def step(self, action):
        try:
            self.last_action = np.array(action, copy=True)
        except Exception:  # keep whatever arrived
            self.last_action = action
        if self.crashed:
            raise RuntimeError(CRASH_MESSAGE)
        if self._obs is None:
            raise RuntimeError("step() called before reset() (or after close())")
        self._maybe_crash()
        a = self._validate(action)
        self.steps += 1

        prev_vec = self._inventory_vector()
        prev_craft_mask = self._masks["craft_smelt"].copy()
        prev_target = self._target_count()
        self._move(a)
        fn = int(a[5])
        self._attack_streak = self._attack_streak + 1 if fn == 3 else 0
        if fn == 2:  # drop (Q): one item of the main-hand stack
            self._remove_from_slot(0, 1)
        elif fn == 3 and self._attack_streak >= self._break_steps:
            self._attack_streak = 0
            pool = HARVEST_POOL + ([self._target[0]] if self._target else [])
            pool = list(dict.fromkeys(pool))
            self._add_item(pool[int(self._rng.integers(len(pool)))], 1)
        elif fn == 4:
            self._craft(int(a[6]))
        elif fn == 5:
            self._equip(int(a[7]))
        elif fn == 6:
            self._place(int(a[7]))
        elif fn == 7:
            self._set_slot(int(a[7]), "air", 0)

        reward, done = 0.0, False
        if self._target is not None:
            name, quantity, weight = self._target
            cur = self._target_count()
            reward = float((cur - prev_target) * weight)
            self._is_successful = (cur - self._ini_target) >= quantity
            done = self._is_successful
        craft_idx = int(a[6]) if fn == 4 else None
        obs = self._observe(delta=(prev_vec, prev_craft_mask, craft_idx))
        self._info = self._make_info()
        return obs, reward, done, dict(self._info)

    def render(self, mode="rgb_array"):
        return None if self._obs is None else self._obs["rgb"].transpose(1, 2, 0).copy()

    def __repr__(self) -> str:
        return f"<StandinEnv {self.task_id!r} (minedojo stand-in, ARNNWrapper API)>"

    # ------------------------------------------------------------------ process life cycle
    def _launch(self) -> None:
        start = time.time()
        time.sleep(float(os.environ.get("MINEDOJO_STANDIN_LAUNCH_SECONDS", "0.2")))
        end = time.time()
        log = os.environ.get("MINEDOJO_STANDIN_LOG")
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{os.getpid()} {start!r} {end!r}\n".encode())
            finally:
                os.close(fd)
        self.launches += 1
        self._launched = True

    def _die(self):
        self.crashed = True
        self._obs = None
        raise RuntimeError(CRASH_MESSAGE)

    def _maybe_crash(self) -> None:
        if self._crash_countdown is not None:
            if self._crash_countdown <= 0:
                self._crash_countdown = None
                self._die()
            self._crash_countdown -= 1
        crash_dir = os.environ.get("MINEDOJO_STANDIN_CRASH_DIR")
        if crash_dir:
            src = os.path.join(crash_dir, "crash")
            try:
                os.rename(src, os.path.join(crash_dir, f"crash.claimed.{os.getpid()}"))
            except FileNotFoundError:
                return
            self._die()

    # ------------------------------------------------------------------ actions
    @property
    def _break_steps(self) -> int:
        return max(1, math.ceil(BASE_BREAK_STEPS / self.break_speed_multiplier))

    def _validate(self, action) -> np.ndarray:
        try:
            a = np.asarray(action)
        except Exception as e:
            raise ValueError(f"action {action!r} is not an array") from e
        if a.shape != (8,) or a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"action {action!r} is not in {self.action_space} (need 8 ints)")
        if np.any(a < 0) or np.any(a >= self.action_space.nvec):
            raise ValueError(f"action {a.tolist()} is outside {self.action_space}")
        m = self._masks
        fn = int(a[5])
        if not m["action_type"][fn]:
            raise ValueError(f"functional action {FN_NAMES[fn]!r} is masked out now")
        if fn == 4 and not m["craft_smelt"][a[6]]:
            item = mc.ALL_CRAFT_SMELT_ITEMS[a[6]]
            raise ValueError(f"cannot craft/smelt {item!r} now (craft_smelt mask)")
        if fn in (5, 6, 7) and not m[FN_NAMES[fn]][a[7]]:
            raise ValueError(f"{FN_NAMES[fn]} on slot {int(a[7])} is masked out now")
        return a.astype(np.int64)

    def _move(self, a: np.ndarray) -> None:
        self._pitch += float(a[3]) * self.cam_interval - 180.0  # not clamped to +-90 on purpose
        self._yaw += float(a[4]) * self.cam_interval - 180.0  # MC does not wrap rotationYaw
        forward = {0: 0.0, 1: 1.0, 2: -1.0}[int(a[0])]
        strafe = {0: 0.0, 1: 1.0, 2: -1.0}[int(a[1])]
        speed = WALK_PER_STEP * {0: 1.0, 1: 1.0, 2: 0.3, 3: 1.3}[int(a[2])]
        yaw = math.radians(self._yaw)
        dx = strafe * math.cos(yaw) - forward * math.sin(yaw)
        dz = forward * math.cos(yaw) + strafe * math.sin(yaw)
        self._pos = self._pos + speed * np.array([dx, 0.0, dz])

    def _craft(self, idx: int) -> None:
        output = mc.ALL_CRAFT_SMELT_ITEMS[idx]
        ingredients, count = mc.RECIPES[output]
        for name, n in ingredients.items():
            for slot in range(mc.N_INV_SLOTS):
                if n == 0:
                    break
                if self._names[slot] == name:
                    take = min(n, int(self._qty[slot]))
                    self._remove_from_slot(slot, take)
                    n -= take
        self._add_item(output, count)

    def _first_slot_named(self, slot: int) -> int:
        # Malmo's equip/place take an item *name* and act on its lowest inventory index
        name = self._names[slot]
        return next(i for i in range(mc.N_INV_SLOTS) if self._names[i] == name)

    def _equip(self, slot: int) -> None:
        name = self._names[slot]
        if name.replace("_", " ") in _NON_MAINHAND:
            dest = EQUIP_SLOTS[mc.BEST_EQUIPMENT_SLOT[name]]
            self._swap(slot if slot == 0 else self._first_slot_named(slot), dest)
        else:
            self._swap(self._first_slot_named(slot), 0)

    def _place(self, slot: int) -> None:
        src = self._first_slot_named(slot)
        name = self._names[src]
        self._remove_from_slot(src, 1)
        yaw = math.radians(self._yaw)
        front = self._pos + np.array([-math.sin(yaw), 0.0, math.cos(yaw)])
        self._placed.append((name, np.floor(front)))

    # ------------------------------------------------------------------ inventory
    def _set_slot(self, slot, name: str, quantity: int) -> None:
        if isinstance(slot, str):
            slot = EQUIP_SLOTS[slot]
        if name not in _ITEM_INDEX:
            raise ValueError(f"Unknown item {name}")
        if name == "air" or quantity <= 0:
            self._names[slot], self._qty[slot], self._dur[slot] = "air", 0, -1.0
            return
        self._names[slot], self._qty[slot] = name, int(quantity)
        self._dur[slot] = float(mc.MAX_DURABILITY.get(name, -1))

    def _swap(self, i: int, j: int) -> None:
        self._names[i], self._names[j] = self._names[j], self._names[i]
        self._qty[[i, j]] = self._qty[[j, i]]
        self._dur[[i, j]] = self._dur[[j, i]]

    def _remove_from_slot(self, slot: int, n: int) -> None:
        left = int(self._qty[slot]) - n
        if left <= 0:
            self._set_slot(slot, "air", 0)
        else:
            self._qty[slot] = left

    def _add_item(self, name: str, count: int) -> int:
        """Minecraft's addItemStackToInventory: top up stacks, then first empty slots."""
        limit = mc.STACK_SIZES.get(name, 64)
        for slot in [0, 40, *range(mc.N_INV_SLOTS)]:
            if count and self._names[slot] == name and self._qty[slot] < limit:
                put = min(count, limit - int(self._qty[slot]))
                self._qty[slot] += put
                count -= put
        for slot in range(mc.N_INV_SLOTS):
            if count and self._names[slot] == "air":
                self._set_slot(slot, name, min(count, limit))
                count -= int(self._qty[slot])
        return count  # what did not fit falls on the ground and is lost

    def _inventory_vector(self) -> np.ndarray:
        vec = np.zeros(len(mc.ALL_ITEMS), dtype=np.int64)
        for slot in range(mc.N_INV_SLOTS):
            vec[_ITEM_INDEX[self._names[slot]]] += self._qty[slot]
        return vec

    def _target_count(self) -> int:
        if self._target is None:
            return 0
        return int(sum(q for n, q in zip(self._names, self._qty) if n == self._target[0]))

    def _nearby(self, name: str) -> bool:
        head = self._pos + np.array([0.0, 1.62, 0.0])
        return any(
            n == name and float(np.sum((p + 0.5 - head) ** 2)) <= NEARBY_DISTANCE**2
            for n, p in self._placed
        )

    # ------------------------------------------------------------------ observations
    def _slots_obs(self, slots: list[int]) -> dict:
        names = [self._names[s].replace("_", " ") for s in slots]
        max_dur = [float(mc.MAX_DURABILITY.get(self._names[s], -1)) for s in slots]
        return {
            "cur_durability": np.array([self._dur[s] for s in slots], dtype=np.float32),
            "max_durability": np.array(max_dur, dtype=np.float32),
            "name": np.array(names, dtype=np.str_),
            "quantity": np.array([self._qty[s] for s in slots], dtype=np.float32),
            "variant": np.zeros(len(slots), dtype=np.int64),
        }

    def _compute_masks(self, inv: dict, table: bool, furnace: bool) -> dict:
        names = inv["name"]
        vec = self._inventory_vector()
        craft = np.all(vec[None, :] >= _RECIPE_MATRIX, axis=1)
        craft[_N_HAND : _N_HAND + _N_TABLE] &= table
        craft[_N_HAND + _N_TABLE :] &= furnace
        occupied = names != "air"
        destroy = occupied.copy()
        place = occupied & np.isin(names, list(_PLACEABLE))
        equip = occupied.copy()
        equip[0] = bool(occupied[0]) and str(names[0]) in _NON_MAINHAND
        action_type = np.array(
            [
                True,  # no_op
                True,  # use
                bool(occupied[0]),  # drop
                True,  # attack
                bool(craft.any()) and not bool(occupied.all()),  # craft
                bool(equip.any()),
                bool(place.any()),
                bool(destroy.any()),
            ],
            dtype=bool,
        )
        return {
            "action_type": action_type,
            "action_arg": _ACTION_ARG.copy(),
            "equip": equip,
            "place": place,
            "destroy": destroy,
            "craft_smelt": craft,
        }

    def _delta_inv(self, delta) -> dict:
        def names(idx, n):
            return np.array(list(_ALL_ITEMS_ARR[idx]) + ["air"] * (n - len(idx)))

        def qty(values, n):
            return np.concatenate([np.abs(values), np.zeros(n - len(values))]).astype(np.float32)

        out = {}
        empty_inc, empty_dec = np.array([], dtype=np.int64), np.array([], dtype=np.int64)
        inc = {"craft": empty_inc, "other": empty_inc}
        dec = {"craft": empty_dec, "other": empty_dec}
        diff = np.zeros(len(mc.ALL_ITEMS))
        if delta is not None:
            prev_vec, prev_mask, craft_idx = delta
            diff = (self._inventory_vector() - prev_vec).astype(np.float64)
            inc_idx = np.flatnonzero(diff > 0)[:1]
            dec_idx = np.flatnonzero(diff < 0)[:4]
            by_craft_inc = by_craft_dec = False
            if craft_idx is not None and prev_mask[craft_idx]:
                product = _ITEM_INDEX[mc.ALL_CRAFT_SMELT_ITEMS[craft_idx]]
                by_craft_inc = product in inc_idx
                ingredients = set(np.flatnonzero(_RECIPE_MATRIX[craft_idx] > 0).tolist())
                by_craft_dec = ingredients.issubset(set(dec_idx.tolist()))
            inc["craft" if by_craft_inc else "other"] = inc_idx
            dec["craft" if by_craft_dec else "other"] = dec_idx
        for kind in ("craft", "other"):
            out[f"inc_name_by_{kind}"] = names(inc[kind], 1)
            out[f"inc_quantity_by_{kind}"] = qty(diff[inc[kind]], 1)
            out[f"dec_name_by_{kind}"] = names(dec[kind], 4)
            out[f"dec_quantity_by_{kind}"] = qty(diff[dec[kind]], 4)
        return out

    def _rgb(self) -> np.ndarray:
        h, w = self.image_size
        rows = np.linspace(-1.0, 1.0, h)[:, None]
        cols = np.linspace(-1.0, 1.0, w)[None, :]
        elevation = -self._pitch - rows * 35.0  # degrees above the horizon for each row
        heading = np.radians(self._yaw + cols * 45.0)
        x, _, z = self._pos
        sky = elevation > 0
        tex = (
            0.5
            + 0.25 * np.sin(3.0 * heading + 0.9 * x)
            + 0.25 * np.cos(0.05 * elevation * (1 + 0.1 * np.cos(heading)) + 0.7 * z)
        )
        shade_sky = 0.75 + 0.25 * np.cos(heading + math.radians(self._pitch))
        img = np.empty((3, h, w), dtype=np.float64)
        for c in range(3):
            img[c] = np.where(sky, self._sky[c] * shade_sky, self._ground[c] * (0.4 + 0.8 * tex))
        return np.clip(img, 0, 255).astype(np.uint8)

    def _voxels(self) -> dict:
        lims = self._voxel_limits
        grid = tuple(1 + hi - lo for lo, hi in lims)
        names = np.full(grid, "air", dtype=object)
        base = np.floor(self._pos)
        for ix in range(grid[0]):
            for iy in range(grid[1]):
                for iz in range(grid[2]):
                    rel = np.array([lims[0][0] + ix, lims[1][0] + iy, lims[2][0] + iz])
                    if rel[1] < 0:
                        names[ix, iy, iz] = "grass" if rel[1] == -1 else "dirt"
                    for n, p in self._placed:
                        if np.array_equal(p, base + rel):
                            names[ix, iy, iz] = n
        names = names.astype(np.str_)
        solid = names != "air"
        yaw, pitch = math.radians(self._yaw), math.radians(self._pitch)
        look = np.array(
            [-math.sin(yaw) * math.cos(pitch), -math.sin(pitch), math.cos(yaw) * math.cos(pitch)]
        )
        rel = np.stack(
            np.meshgrid(*[np.arange(lo, hi + 1) for lo, hi in lims], indexing="ij"), axis=-1
        ).astype(np.float64)
        rel = rel + 0.5 - (self._pos - base - np.array([0.0, 1.62, 0.0]))
        norm = np.linalg.norm(rel, axis=-1)
        cos = (rel @ look) / np.maximum(norm, 1e-6)
        return {
            "block_name": names,
            "block_meta": np.zeros(grid, dtype=np.int64),
            "is_collidable": solid.copy(),
            "is_tool_not_required": ~np.isin(names, ["cobblestone", "stone", "furnace"]),
            "blocks_movement": solid.copy(),
            "is_liquid": np.zeros(grid, dtype=bool),
            "is_solid": solid.copy(),
            "can_burn": np.isin(names, list(_BURNABLE)),
            "blocks_light": solid.copy(),
            "cos_look_vec_angle": cos.astype(np.float32),
        }

    def _observe(self, delta) -> dict:
        f = np.float32
        inv = self._slots_obs(list(range(mc.N_INV_SLOTS)))
        table, furnace = self._nearby("crafting_table"), self._nearby("furnace")
        zero1 = np.zeros(1, dtype=f)
        obs = {
            "rgb": self._rgb(),
            "inventory": inv,
            "equipment": self._slots_obs(EQUIPMENT_ORDER),
            # Malmo sends booleans for is_sleeping / is_raining / can_see_sky and MineDojo
            # passes them through as 0-d bool arrays (their spaces say int): mirrored here
            "life_stats": {
                "armor": zero1.copy(),
                "food": np.array([self._food], dtype=f),
                "is_sleeping": np.array(False),
                "life": np.array([self._life], dtype=f),
                "oxygen": np.array([mc.MAX_BREATH], dtype=f),
                "saturation": np.array([5.0], dtype=f),
                "xp": zero1.copy(),
            },
            "location_stats": {
                "biome_id": np.array(self._biome_id, dtype=np.int64),
                "can_see_sky": np.array(True),
                "is_raining": np.array(False),
                "light_level": np.array([15.0], dtype=f),
                "pitch": np.array([self._pitch], dtype=f),
                "pos": self._pos.astype(f),
                "rainfall": np.array([0.8], dtype=f),
                "sea_level": np.array([63.0], dtype=f),
                "sky_light_level": np.array([0.71], dtype=f),
                "sun_brightness": np.array([0.94], dtype=f),
                "temperature": np.array([0.7], dtype=f),
                "yaw": np.array([self._yaw], dtype=f),
            },
            "nearby_tools": {
                "table": np.array(table, dtype=bool),
                "furnace": np.array(furnace, dtype=bool),
            },
            "damage_source": {
                "damage_amount": zero1.copy(),
                "damage_distance": zero1.copy(),
                "damage_pitch": zero1.copy(),
                "damage_yaw": zero1.copy(),
                "hunger_damage": zero1.copy(),
                "is_explosion": np.array(False),
                "is_fire_damage": np.array(False),
                "is_magic_damage": np.array(False),
                "is_projectile": np.array(False),
                "is_unblockable": np.array(False),
            },
        }
        if self._voxel_limits is not None:
            obs["voxels"] = self._voxels()
        self._masks = self._compute_masks(inv, table, furnace)
        obs["masks"] = {k: v.copy() for k, v in self._masks.items()}
        obs["delta_inv"] = self._delta_inv(delta)
        self._obs = obs
        return obs

    def _make_info(self) -> dict:
        inventory = [
            {
                "name": self._names[s],
                "variant": 0,
                "quantity": int(self._qty[s]),
                "max_durability": int(mc.MAX_DURABILITY.get(self._names[s], -1)),
                "cur_durability": int(self._dur[s]),
                "index": s,
                "inventory": "inventory",
            }
            for s in range(N_SLOTS_TOTAL)
        ]
        x, y, z = (float(v) for v in self._pos)
        return {
            "inventory": inventory,
            "xpos": x,
            "ypos": y,
            "zpos": z,
            "pitch": float(self._pitch),
            "yaw": float(self._yaw),
            "life": float(self._life),
            "food": float(self._food),
            "nearby_crafting_table": self._nearby("crafting_table"),
            "nearby_furnace": self._nearby("furnace"),
        }
