"""``django_semaphore.handoff``: the hand-off errors, where the docs name them. Tickets are
made and read in :mod:`django_semaphore.engine.handoff`."""

from .engine.handoff import AlreadyAdopted, HandoffError

__all__ = ["AlreadyAdopted", "HandoffError"]
