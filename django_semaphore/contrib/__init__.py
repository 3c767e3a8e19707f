"""Integrations with other libraries (optional extras): :mod:`django_semaphore.contrib.celery`.

Nothing in the rest of the package imports this package: an integration is
imported by the user's code only, when its library is installed.
"""
