"""The agent's networks on torchrl's modules: world model, actor, critic, the acting step,
and how an env's spaces become their inputs and outputs."""
