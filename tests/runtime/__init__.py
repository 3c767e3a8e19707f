"""Tests of django_semaphore/runtime/, one file per module."""
