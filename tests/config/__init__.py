"""Tests of django_semaphore/config/, one file per module."""
