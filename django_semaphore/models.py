"""The table-less model behind the admin pages.

Semaphores live in Redis, not in the database: ``Semaphore`` is an unmanaged
model (no table is ever created) that exists for the admin index entry, the
usual ``view``/``change`` permissions, and the admin's LogEntry history of
force-releases.  Never query it: the admin pages read Redis.
"""

from django.db import models
from django.utils.translation import gettext_lazy as _


class Semaphore(models.Model):
    """A configured semaphore, as the admin and its permissions see it.

    Not :class:`django_semaphore.Semaphore` (the engine's, which acquires
    slots): this one only gives the admin its entry.  Its name is kept on
    purpose: a model's name fixes its permission codenames
    (``django_semaphore.view_semaphore``, ``django_semaphore.change_semaphore``),
    its content type (which LogEntry history points at) and its admin URLs
    (``/admin/django_semaphore/semaphore/``), and operators grant those to
    their groups and link to those pages.
    """

    name = models.CharField(_("name"), max_length=200, primary_key=True)

    class Meta:
        managed = False
        verbose_name = _("semaphore")
        verbose_name_plural = _("semaphores")

    def __str__(self) -> str:
        return self.name
