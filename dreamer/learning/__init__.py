"""One DreamerV3 update: the loss with its scales, the fused rollouts and the
optimizer step through torchrl's stepper."""
