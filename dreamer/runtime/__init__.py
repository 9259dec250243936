"""The processes a run is made of and what lets them survive: usable cores, ranks and
collectives, checkpoints, the run lock, stop signals, relaunch counts, the frozen heap,
the loop's schedules and timers."""
