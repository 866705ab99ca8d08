"""Daemon command handlers for backup (registered on import by ``_commands``)."""
