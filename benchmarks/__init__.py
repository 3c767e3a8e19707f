"""``make bench``: django-semaphore beside the round-trip floor, its peers and an unguarded view.

Run with ``python -m benchmarks`` (``--help`` for the options).  Every figure
of one run is measured in that run, side by side, against throwaway
redis-server processes the run starts and stops itself.
"""
