"""Greedy evaluation: the eval process and its runner, the periodic schedule
during training, reports and the render pool that draws them."""
