"""Imported last by the collector's forkserver, after the modules it preloads: freezes
their objects (``gc.freeze()``), so that a collection in a forked env worker never
walks them and writes their headers, which would copy the pages the workers share;
and ties the forkserver's life to the driver's (``die_with_parent``).

Importing this module has that effect on purpose; nothing else imports it."""

import gc

from dreamer.runtime.signals import die_with_parent

die_with_parent()
gc.freeze()
