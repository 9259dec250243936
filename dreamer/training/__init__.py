"""A training run assembled from its config: its parts, its run directory, warm
starts and sweeps."""
