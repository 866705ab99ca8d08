"""Daemon command handlers for mount (registered on import by ``_commands``)."""
