"""One DreamerV3 update: the agent's loss through torchrl's stepper, the optimizer that
skips non-finite steps, compilation, CUDA graphs and precision."""
