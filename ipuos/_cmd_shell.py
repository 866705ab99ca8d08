"""Daemon command handlers for shell (registered on import by ``_commands``)."""
