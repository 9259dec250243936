"""A trained agent acting outside training: ``Policy`` (``from dreamer import Policy``)."""
