"""Stand-in for ``minedojo.sim.mc_meta``."""
