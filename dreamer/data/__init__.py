"""Experience on its way to the learner: the env-worker collector, the episode
counters and the replay buffer."""
