"""A URLconf without guarded views: the settings checks' tests (tests/test_checks.py) run
every system check, and tests.support.urls guards its views with entries only the web tests define."""

urlpatterns: list[object] = []
