#!/usr/bin/env python
"""The demo site's manage.py: ``python testproject/manage.py demo`` (what ``make demo`` runs)."""

import os
import sys

if __name__ == "__main__":
    # The repository root, so that ``testproject`` and ``django_semaphore`` import from anywhere.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
