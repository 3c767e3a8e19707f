"""Test support: what the tests run against, not tests themselves.

The Django settings and URLconfs of the test sessions (``settings``,
``settings_web``, ``settings_bad``, ``settings_celery``, ``urls*``, ``views``,
``web_urls``), the servers a session starts (``servers``: redis-server, Cluster and Sentinel
nodes; ``fixtures_redis``: the pytest fixtures over them), the browser
(``browser``), the ASGI and Celery applications (``asgi_web``,
``celery_app``, ``handoff_site``), shared helpers (``helpers``) and the
worker processes the multi-process tests spawn (``workers/``).
"""
