"""The environments: one module per kind (``crafter``, ``cue``, ``gymnasium_ids`` for
``cartpole``/``gym``, ``dmc``, ``atari``, ``minedojo``), the table of kinds
(``registry.py``), and ``make.make_env``: an env of any kind as a torchrl ``EnvBase``
with what the acting policy needs."""
