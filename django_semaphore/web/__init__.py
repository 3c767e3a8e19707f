"""The web layer: semaphores around Django views, and what a refused request gets.

* :mod:`.decorators`: ``@semaphore(name, ...)`` on views;
* :mod:`.middleware`: :class:`~.middleware.SemaphoreMiddleware`, guarding the
  requests SEMAPHORES' PATHS / URL_NAMES / METHODS match;
* :mod:`.needs`: what a request needs, in the one global order;
* :mod:`.request_guard`: one request's semaphores, all or none, and their
  give-back; :mod:`.users`: loading ``request.user`` first;
* :mod:`.responses` and :mod:`.views`: the 429 and 503 responses and the
  failure policy; :mod:`.streaming`: holding the slot until a stream is closed.

Uses :mod:`django_semaphore.engine` and the layers below it; knows nothing of
:mod:`django_semaphore.ops`. The public paths ``django_semaphore.middleware``,
``django_semaphore.views`` and ``django_semaphore.decorators`` re-export from here.
"""
