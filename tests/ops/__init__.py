"""Tests of django_semaphore/ops/, one file per module."""
