"""Helpers for projects testing code that uses django-semaphore."""
