"""Tests of django_semaphore/engine/, one file per module."""
