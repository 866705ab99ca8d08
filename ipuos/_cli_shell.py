"""CLI commands for shell (added to the ``ipuos`` group on import by ``_cli``)."""
