"""CLI commands for mount (added to the ``ipuos`` group on import by ``_cli``)."""
