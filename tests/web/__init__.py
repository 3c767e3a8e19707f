"""Tests of django_semaphore/web/, one file per module."""
