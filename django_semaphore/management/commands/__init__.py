"""``sema_cleanup``, ``sema_set`` and ``sema_status``: see docs/commands.rst."""
