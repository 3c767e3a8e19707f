"""The migration of the unmanaged model behind the admin entry (no table is created)."""
