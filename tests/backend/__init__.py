"""Tests of django_semaphore/backend/, one file per module."""
