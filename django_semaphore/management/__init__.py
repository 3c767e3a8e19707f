"""Django's management commands of the app (``management/commands/``)."""
