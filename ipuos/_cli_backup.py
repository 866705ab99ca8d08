"""CLI commands for backup (added to the ``ipuos`` group on import by ``_cli``)."""
