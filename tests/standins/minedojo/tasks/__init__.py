"""``minedojo.tasks``: the task ids. The real list also holds the combat, tech-tree,
survival and creative ids; the stand-in models harvest tasks only, so it lists those."""

from ..sim.mc_meta import mc

ALL_PROGRAMMATIC_TASK_IDS = sorted(mc.HARVEST_TASKS)
ALL_CREATIVE_TASK_IDS: list[str] = []
PLAYTHROUGH_TASK_ID = "playthrough"
ALL_TASK_IDS = ALL_PROGRAMMATIC_TASK_IDS + ALL_CREATIVE_TASK_IDS + [PLAYTHROUGH_TASK_ID]
