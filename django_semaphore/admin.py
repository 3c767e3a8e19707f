"""Admin pages: the semaphores in Redis, their partitions and holders.

There is no database table: :class:`~django_semaphore.models.Semaphore` is an
unmanaged model that gives the admin index entry and the permissions, and
:class:`SemaphoreAdmin` replaces the changelist and change views with pages
that read Redis.  Every view goes through ``self.admin_site.admin_view``
(login, CSRF, never_cache), so a custom AdminSite works too::

    my_site.register(Semaphore, SemaphoreAdmin)

Users with the ``view`` permission see the figures, the limit and mode in
force (and whether they come from settings or a runtime override), the
waiters, the refusals and would-be (dry-run) refusals of the last five
minutes, hold times, and every key and value of the holders' and waiters'
meta (the web layer's and the caller's own); with the ``change`` permission
they also get the runtime control form (limit, mode, clear override; the total
too for a semaphore with TOTAL) and the force-release and purge-expired buttons.
A semaphore with TOTAL shows its whole name's use, a bar against the total in
force, above its partitions (each against its limit).  Every change is logged as a
:class:`~django.contrib.admin.models.LogEntry`, shown in the admin's recent
actions and the semaphore's history page.  Ad-hoc semaphores (no SEMAPHORES
entry) in use are listed too, marked "ad hoc", with the limit and lease their
processes recorded (:mod:`django_semaphore.runtime.adhoc`); their pages have no
runtime control form (their code sets them).  While Redis is down, every page
shows Redis's error in place of the figures, an ad-hoc semaphore's too (whether
one is recorded cannot be told then: not a 404), and the buttons say it failed.
Lease identifiers are never shown
to anyone: a force-release names the holder by partition and fencing token,
which cannot be replayed against a later holder because tokens only increase.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.db import DatabaseError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
)
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy
from django.utils.translation import ngettext

from .backend.keys import UNPARTITIONED
from .config.validation import MAX_LIMIT, MODES, limit_from_text
from .engine.inspection import Holder, Waiter
from .engine.semaphore import Semaphore as Engine
from .engine.semaphore import semaphores
from .exceptions import SemaphoreBackendError
from .models import Semaphore
from .ops import monitor
from .runtime import adhoc
from .runtime.control import Effective


class LimitField(forms.Field):
    """A limit as typed: ASCII digits for a number from 0 to MAX_LIMIT, exactly as
    ``sema_set --limit`` takes it (:func:`~django_semaphore.config.validation.limit_from_text`);
    unlike ``IntegerField``, no sign, spaces, "_" or other scripts' digits."""

    widget = forms.NumberInput

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None  # "This field is required."
        try:  # the error names the field: "Limit must be ...", "Total must be ..."
            return limit_from_text(value, what=str(self.label or _("Limit")))
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid") from None

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        return {**super().widget_attrs(widget), "min": 0, "max": MAX_LIMIT, "step": 1}


class RuntimeControlForm(forms.Form):
    """The semaphore page's runtime control: the limit and mode every process applies,
    and the total of a semaphore with TOTAL (``with_total``; the field is left out otherwise).

    Shown filled with the values in force; only the fields changed are
    overridden (:meth:`django_semaphore.Semaphore.override`), so changing the
    mode keeps the limit from settings.  "Changed" is against the values the
    page showed (posted back in hidden ``initial-*`` fields), not only those in
    force when the POST arrives: a field left as shown keeps whatever another
    operator (or the adaptive controller) set meanwhile.  The "clear override"
    button goes back to settings without looking at the fields.
    """

    limit = LimitField(
        label=_lazy("Limit"),
        help_text=format_lazy(
            _lazy(
                "Slots per partition, from 0 to {max}. 0 pauses: new callers are refused, "
                "holders keep their slots."
            ),
            max=f"{MAX_LIMIT:,}",
        ),
        widget=forms.NumberInput(attrs={"class": "vIntegerField"}),
    )
    mode = forms.ChoiceField(
        label=_lazy("Mode"),
        choices=[(mode, mode) for mode in MODES],
        help_text=_lazy(
            "enforce: refuse or queue beyond the limit; dry_run: admit everyone and count "
            "would-be refusals; off: guards pass through without Redis."
        ),
    )
    total = LimitField(
        label=_lazy("Total"),
        help_text=format_lazy(
            _lazy(
                "Permits across all partitions together, from 0 to {max}; each partition still "
                "has its limit. 0 pauses every partition: holders keep their permits."
            ),
            max=f"{MAX_LIMIT:,}",
        ),
        widget=forms.NumberInput(attrs={"class": "vIntegerField"}),
    )

    def __init__(self, *args: Any, with_total: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not with_total:
            del self.fields["total"]
        for field in self.fields.values():
            field.show_hidden_initial = True  # the value shown, to tell what the operator changed

    def changes(self, current: Effective) -> dict[str, Any]:
        """The cleaned fields the operator changed from the values shown (a POST without
        them: every field) that differ from ``current`` (the keywords for ``override()``)."""
        names = [name for name in ("limit", "mode", "total") if name in self.changed_data]
        wanted = {name: self.cleaned_data[name] for name in names}
        return {name: value for name, value in wanted.items() if value != getattr(current, name)}

    def moved(self, current: Effective) -> list[str]:
        """The fields left as shown whose value in force is no longer the one shown (changed
        meanwhile by someone else, or by the adaptive controller): not applied."""
        names = [name for name in ("limit", "mode", "total") if name in self.fields]
        return [
            name
            for name in names
            if name not in self.changed_data and self.cleaned_data[name] != getattr(current, name)
        ]


class SemaphoreAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The semaphore dashboard: a list page and one page per semaphore."""

    #: Seconds between the in-page refreshes of the figures.
    refresh_interval = 3
    #: Partitions shown per semaphore on the list, and per page (``?page=N``) on its own
    #: page (busiest first).
    max_partitions = monitor.MAX_PARTITIONS
    list_template = "django_semaphore/admin/semaphore_list.html"
    detail_template = "django_semaphore/admin/semaphore_detail.html"
    control_form = RuntimeControlForm

    # -- permissions ---------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        """The admin model instance of a semaphore (None if unknown), without a query.

        There is no table: the instance is made up from the name (an ad-hoc
        semaphore's :attr:`~django_semaphore.ops.monitor.SemaphoreSummary.ident`),
        which is all the history view (and LogEntry) needs.
        """
        if object_id in semaphores:
            return Semaphore(name=object_id)
        try:
            return Semaphore(name=object_id) if monitor.find_ad_hoc(object_id) else None
        except SemaphoreBackendError:
            # Redis is down: whether an ad-hoc semaphore of that name is in use cannot be
            # told, and its history is in the database: shown (not "does not exist").
            return Semaphore(name=object_id)

    # -- urls ----------------------------------------------------------------

    def _url_name(self, suffix: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{suffix}"

    def _reverse(self, suffix: str, *args: Any) -> str:
        return reverse(f"{self.admin_site.name}:{self._url_name(suffix)}", args=args)

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., Any]) -> Callable[..., Any]:
            wrapped = self.admin_site.admin_view(view)
            wrapped.model_admin = self  # type: ignore[attr-defined]
            return wrapped

        # No add or delete views: there is no table behind them. The history
        # view is Django's own, over the LogEntry rows (see get_object).
        return [
            path("", wrap(self.changelist_view), name=self._url_name("changelist")),
            path("status.json", wrap(self.list_status_view), name=self._url_name("status")),
            path("<str:object_id>/", wrap(self.change_view), name=self._url_name("change")),
            path(
                "<str:object_id>/status.json",
                wrap(self.detail_status_view),
                name=self._url_name("detail_status"),
            ),
            path(
                "<str:object_id>/release/",
                wrap(self.force_release_view),
                name=self._url_name("force_release"),
            ),
            path("<str:object_id>/purge/", wrap(self.purge_view), name=self._url_name("purge")),
            path("<str:object_id>/history/", wrap(self.history_view), name=self._url_name("history")),
        ]

    # -- reading Redis -------------------------------------------------------

    def _semaphore_name(self, object_id: str) -> str:
        name = unquote(object_id)
        if name not in semaphores:
            raise Http404(_("No semaphore named %(name)r in SEMAPHORES.") % {"name": name})
        return name

    def _target(self, object_id: str) -> Target:
        """The semaphore a page is about: configured, or else ad hoc as recorded (404 if neither).

        Raises :class:`~django_semaphore.SemaphoreBackendError` when Redis fails to say
        whether an ad-hoc one is recorded: the pages show that error, as they do for a
        configured semaphore while Redis is down, not a 404."""
        ident = unquote(object_id)
        if ident in semaphores:
            return Target(ident, ident, semaphores[ident], None)
        try:
            entry = monitor.find_ad_hoc(ident)
            engine = monitor.ad_hoc_semaphore(entry) if entry is not None else None
        except ValueError:  # a record no version of this app wrote
            entry = engine = None
        if entry is None or engine is None:
            raise Http404(_("No semaphore named %(name)r in SEMAPHORES or in use.") % {"name": ident[:200]})
        return Target(entry.name, ident, engine, entry)

    def _partition_param(self, request: HttpRequest) -> str | None:
        return request.GET.get("partition") or None

    def _page_param(self, request: HttpRequest) -> int:
        """The page of partitions asked for (``?page=N``, from 1; 404 unless ASCII digits)."""
        text = request.GET.get("page") or "1"
        if not (text.isascii() and text.isdigit() and 1 <= len(text) <= 9 and int(text) >= 1):
            raise Http404(_("No such page."))
        return int(text)

    def _query(self, request: HttpRequest) -> str:
        """``?partition=...&page=...`` as the request has them (URL-encoded), or ``""``."""
        params = {name: request.GET[name] for name in ("partition", "page") if request.GET.get(name)}
        return "?" + urlencode(params) if params else ""

    def _read_all(self) -> tuple[monitor.Overview, str]:
        try:
            return monitor.overview(self.max_partitions), ""
        except SemaphoreBackendError as exc:
            return monitor.Overview([]), str(exc)

    def _read_one(
        self, name: str, partition: str | None, offset: int = 0
    ) -> tuple[monitor.SemaphoreSummary, str]:
        try:
            summary = monitor.read_semaphore(
                name, partition, self.max_partitions, with_holders=True, offset=offset
            )
            return summary, ""
        except ValueError:
            raise Http404(_("No such partition."))
        except SemaphoreBackendError as exc:
            return monitor.SemaphoreSummary(name), str(exc)

    def _holders_clock(self, sem: Engine, view: monitor.SemaphoreSummary) -> datetime.datetime:
        """Now, on the clock that wrote the expiries and arrivals shown (Redis's for "lua"):
        a round trip only when there are holders or waiters to show, this process's clock
        if Redis fails.  Aware, as they are (``timezone.now()`` is naive with USE_TZ False)."""
        if not any(p.holders or p.waiters for p in view.partitions):
            return datetime.datetime.now(datetime.UTC)
        try:
            return monitor.holders_clock(sem)
        except (SemaphoreBackendError, ImproperlyConfigured):
            return datetime.datetime.now(datetime.UTC)

    def _user_names(self, values: Iterable[Any]) -> dict[str, str]:
        """{str(pk): username} of the users the web layer recorded (meta "user" is the pk)."""
        User = get_user_model()
        pks: set[Any] = set()
        for value in values:
            if value in (None, ""):
                continue
            try:
                pk = User._meta.pk.to_python(value)
            except (ValidationError, ValueError, TypeError):
                continue
            if isinstance(pk, int) and not -(2**63) <= pk < 2**63:
                continue  # no database's pk: the lookup would fail (SQLite: OverflowError) for all
            pks.add(pk)
        if not pks:
            return {}
        try:
            rows = User._default_manager.filter(pk__in=pks).values_list("pk", User.USERNAME_FIELD)
            return {str(pk): str(name) for pk, name in rows}
        except (DatabaseError, ValueError, OverflowError):  # SQLite: an int beyond 64 bits
            return {}

    def _context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]:
        request.current_app = self.admin_site.name
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "has_view_permission": self.has_view_or_change_permission(request),
            "has_change_permission": self.has_change_permission(request),
            "refresh_interval_ms": int(self.refresh_interval * 1000),
            "now": timezone.now(),
            **extra,
        }

    def _list_context(self, request: HttpRequest) -> dict[str, Any]:
        found, error = self._read_all()
        views = found.semaphores
        for view in views:
            view.url = self._reverse("change", quote(view.ident))  # type: ignore[attr-defined]
        return self._context(
            request,
            title=_("Semaphores"),
            subtitle=None,
            semaphores=views,
            totals=monitor.totals(views, found.ad_hoc_not_listed),
            backend_error=error,
            status_url=self._reverse("status"),
        )

    def _detail_context(
        self, request: HttpRequest, object_id: str, form: RuntimeControlForm | None = None
    ) -> dict[str, Any]:
        partition = self._partition_param(request)
        page = 1 if partition else self._page_param(request)
        target: Target | None
        try:
            target = self._target(object_id)
        except SemaphoreBackendError as exc:  # an ad-hoc one, with Redis down: its page says so
            target = None
            view, error = monitor.SemaphoreSummary(unquote(object_id)), str(exc)
            now = datetime.datetime.now(datetime.UTC)
        else:
            view, error = self._read_one(target.ident, partition, (page - 1) * self.max_partitions)
            now = self._holders_clock(target.semaphore, view)  # for expiries and waits only
        name = view.name if target is None else target.name
        metas = [h.meta for p in view.partitions for h in p.holders]
        metas += [w.meta for p in view.partitions for w in p.waiters]
        names = self._user_names(meta.get("user") for meta in metas)
        for p in view.partitions:
            p.rows = [  # type: ignore[attr-defined]
                (h, monitor.expires_in(h, now), names.get(str(h.meta.get("user"))), meta_items(h.meta))
                for h in p.holders
            ]
            p.waiter_rows = [  # type: ignore[attr-defined]
                (w, waited(w, now), names.get(str(w.meta.get("user"))), meta_items(w.meta)) for w in p.waiters
            ]
        # No runtime control of an ad-hoc semaphore (sema_set refuses it too): its code sets it.
        controlled = target is not None and target.entry is None and not view.error and view.mode
        if form is None and controlled and self.has_change_permission(request):
            initial = {"limit": view.limit, "mode": view.mode, "total": view.total}
            form = self.control_form(initial=initial, with_total=view.total is not None)
        query = self._query(request)
        pages = {
            "page_first": view.offset + 1,
            "page_last": view.offset + len(view.partitions),
            "prev_page_url": f"?page={page - 1}" if page > 1 else "",
            "next_page_url": f"?page={page + 1}"
            if view.offset + len(view.partitions) < view.partition_count
            else "",
        }
        return self._context(
            request,
            title=_("Semaphore “%(name)s”") % {"name": name},
            subtitle=None,
            object_id=object_id,
            semaphore=view,
            partition=partition,
            backend_error=error,
            list_url=self._reverse("changelist"),
            detail_url=self._reverse("change", object_id),
            status_url=self._reverse("detail_status", object_id) + query,
            release_url=self._reverse("force_release", object_id) + query,
            purge_url=self._reverse("purge", object_id) + query,
            history_url=self._reverse("history", object_id),
            control_form=form,
            page_query=query,
            clock=now,
            **pages,
        )

    # -- pages ---------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Every configured semaphore and its live partitions, with a utilisation bar."""
        self._require_view(request)
        context = {**self._list_context(request), **(extra_context or {})}
        return TemplateResponse(request, self.list_template, context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """One semaphore's runtime control, figures, waiters and holders (in token order), per partition.

        A POST is the runtime control form (change permission): it overrides
        the fields changed, or with ``clear`` removes the override, logs a
        LogEntry and redirects back; an invalid form is shown again with its
        errors and nothing written.
        """
        self._require_view(request)
        form = None
        if request.method == "POST":
            if not self.has_change_permission(request):
                raise PermissionDenied
            form, done = self._apply_control(request, object_id)
            if done is not None:
                return done
        context = {**self._detail_context(request, object_id, form), **(extra_context or {})}
        return TemplateResponse(request, self.detail_template, context)

    def _apply_control(
        self, request: HttpRequest, object_id: str
    ) -> tuple[RuntimeControlForm | None, HttpResponse | None]:
        """Apply a POSTed runtime control form: ``(form with errors, None)`` or ``(None, redirect)``."""
        name = self._semaphore_name(object_id)
        sem = semaphores[name]
        clear = "clear" in request.POST
        form = None if clear else self.control_form(request.POST, with_total=has_total(sem))
        try:
            old = sem.effective()
            if form is not None and not form.is_valid():
                return form, None
            if clear:
                if old.source != "override":
                    messages.info(request, _("“%(name)s” has no override to clear.") % {"name": name})
                    return None, self._back(request, object_id)
                new = sem.clear_override(user=request.user)
            else:
                assert form is not None
                changes = form.changes(old)
                if not changes:
                    text = nothing_changed(old)
                    if form.moved(old):
                        text += " " + _(
                            "The values in force changed since this page was shown: it shows them now."
                        )
                    messages.info(request, text)
                    return None, self._back(request, object_id)
                new = sem.override(**changes, user=request.user)
        except ValueError as exc:  # the engine's own validation: nothing was written
            assert form is not None
            form.add_error(None, str(exc))
            return form, None
        except SemaphoreBackendError as exc:
            messages.error(request, str(exc))
            return form, None
        described = monitor.describe_change(old, new)
        text = (_("Cleared the override: %(change)s.") if clear else _("Set %(change)s.")) % {
            "change": described
        }
        self.log_change(request, Semaphore(name=name), text)
        messages.success(request, _("“%(name)s”: %(text)s") % {"name": name, "text": text})
        return None, self._back(request, object_id)

    def _json(
        self, request: HttpRequest, context: dict[str, Any], fragment: str, data: dict[str, Any]
    ) -> JsonResponse:
        data["html"] = render_to_string(fragment, context, request=request)
        data["error"] = context["backend_error"]
        data["generated_at"] = context["now"].isoformat()
        return JsonResponse(data)

    def list_status_view(self, request: HttpRequest) -> JsonResponse:
        """The list page's figures as JSON (plus the re-rendered table), for the refresh script."""
        self._require_view(request)
        context = self._list_context(request)
        data = {
            "semaphores": [v.as_dict(context["now"]) for v in context["semaphores"]],
            "totals": context["totals"].as_dict(),
        }
        return self._json(request, context, "django_semaphore/admin/_semaphores.html", data)

    def detail_status_view(self, request: HttpRequest, object_id: str) -> JsonResponse:
        """A semaphore page's figures and holders as JSON (never lease identifiers)."""
        self._require_view(request)
        context = self._detail_context(request, object_id)
        data = context["semaphore"].as_dict(context["clock"], holders=True)
        return self._json(request, context, "django_semaphore/admin/_holders.html", data)

    # -- actions -------------------------------------------------------------

    def _post_only(self, request: HttpRequest) -> HttpResponse | None:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        return None

    def _back(self, request: HttpRequest, object_id: str) -> HttpResponseRedirect:
        """To the semaphore's page, on the partition or page the action was taken on."""
        # URL-encoded (not the admin's quote(), which is for object ids in paths: "_" -> "_5F").
        return HttpResponseRedirect(self._reverse("change", object_id) + self._query(request))

    def force_release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST partition + token: remove that holder (change permission), logged to LogEntry."""
        refused = self._post_only(request)
        if refused:
            return refused
        try:
            target = self._target(object_id)
        except SemaphoreBackendError as exc:
            messages.error(request, str(exc))
            return self._back(request, object_id)
        name, sem = target.name, target.semaphore
        key_hash = request.POST.get("partition", "")
        try:
            token = int(request.POST.get("token", ""))
            keys = monitor.partition_keys(sem, key_hash, target.entry.digest if target.entry else None)
        except ValueError:
            messages.error(request, _("That form named no holder."))
            return self._back(request, object_id)
        try:
            holder = next((h for h in sem.holders(keys=keys) if h.token == token), None)
            released = holder is not None and sem.force_release(holder.identifier, keys=keys)
        except SemaphoreBackendError as exc:
            messages.error(request, str(exc))
            return self._back(request, object_id)
        if not released:
            messages.warning(
                request,
                _("Token %(token)s no longer holds a slot of “%(name)s”.") % {"token": token, "name": name},
            )
            return self._back(request, object_id)
        assert holder is not None  # released implies a holder was found
        described = describe_holder(holder, key_hash)
        self.log_change(
            request,
            Semaphore(name=target.ident),
            _("Force-released token %(token)s (%(holder)s).") % {"token": token, "holder": described},
        )
        messages.success(
            request,
            _("Released token %(token)s of “%(name)s” (%(holder)s).")
            % {"token": token, "name": name, "holder": described},
        )
        return self._back(request, object_id)

    def purge_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: remove the expired entries of every partition (change permission)."""
        refused = self._post_only(request)
        if refused:
            return refused
        try:
            target = self._target(object_id)
        except SemaphoreBackendError as exc:
            messages.error(request, str(exc))
            return self._back(request, object_id)
        name = target.name
        try:
            if target.entry is None:
                removed = target.semaphore.purge_expired()
            else:  # found by its name's digest: the name may have been cut
                removed = monitor.purge_ad_hoc(target.entry)
        except SemaphoreBackendError as exc:
            messages.error(request, str(exc))
            return self._back(request, object_id)
        text = ngettext(
            "Removed %(count)d expired entry from “%(name)s”.",
            "Removed %(count)d expired entries from “%(name)s”.",
            removed,
        ) % {"count": removed, "name": name}
        if removed:
            self.log_change(request, Semaphore(name=target.ident), text)
        messages.success(request, text)
        return self._back(request, object_id)


class Target(NamedTuple):
    """The semaphore an admin page is about."""

    name: str  # its name (an ad-hoc one's as recorded: maybe cut)
    ident: str  # what names it in the page's URL
    semaphore: Engine  # the engine's Semaphore
    entry: adhoc.Entry | None  # the registry's record of an ad-hoc one; None: configured


#: Meta keys listed first, in this order: the web layer's, then the engine's.
#: The caller's own keys follow in name order; "user" has a column of its own.
META_ORDER = ("method", "path", "remote_addr", "key", "host", "pid")
#: Characters of a meta key / value shown in the holder table: the page stays
#: readable whatever a caller stores, and the full text is in the tooltip.
META_KEY_CHARS = 40
META_VALUE_CHARS = 80


class MetaItem(NamedTuple):
    """One meta key and value as the holder table shows it (``*_title``: the full text, if cut)."""

    key: str
    key_shown: str
    key_title: str | None
    shown: str
    title: str | None


def _cut(text: str, limit: int) -> tuple[str, str | None]:
    if len(text) <= limit:
        return text, None
    return text[: limit - 1] + "…", text


def meta_items(meta: dict[str, Any]) -> list[MetaItem]:
    """Every key and value of a holder's meta but "user", in display order.

    Strings are shown as they are, anything else as JSON (``3``, ``null``,
    ``["a", "b"]``).  Keys and values are cut to :data:`META_KEY_CHARS` /
    :data:`META_VALUE_CHARS` characters; the template escapes them.
    """
    first = [key for key in META_ORDER if key in meta]
    rest = sorted(key for key in meta if key not in META_ORDER and key != "user")
    items = []
    for key in first + rest:
        value = meta[key]
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        key_shown, key_title = _cut(key, META_KEY_CHARS)
        shown, title = _cut(text, META_VALUE_CHARS)
        items.append(MetaItem(key, key_shown, key_title, shown, title))
    return items


def has_total(sem: Engine) -> bool:
    """Whether ``sem`` has a TOTAL (False when its settings cannot be read)."""
    try:
        return sem.config.total is not None
    except ImproperlyConfigured:
        return False


def nothing_changed(current: Effective) -> str:
    """The message for a runtime control form that changes nothing."""
    if current.total is None:
        return _("Nothing changed: limit %(limit)s and mode %(mode)s are already in force.") % {
            "limit": current.limit,
            "mode": current.mode,
        }
    return _("Nothing changed: limit %(limit)s, mode %(mode)s and total %(total)s are already in force.") % {
        "limit": current.limit,
        "mode": current.mode,
        "total": current.total,
    }


def waited(waiter: Waiter, now: datetime.datetime) -> int:
    """Whole seconds ``waiter`` has queued for."""
    return max(0, round((now - waiter.since).total_seconds()))


def describe_holder(holder: Holder, key_hash: str) -> str:
    """A one-line description of a holder for messages and the admin history."""
    meta = holder.meta
    parts = []
    if key_hash != UNPARTITIONED:
        parts.append(f"partition {meta.get('key') or key_hash}")
    if meta.get("user"):
        parts.append(f"user {meta['user']}")
    if meta.get("method") or meta.get("path"):
        parts.append(" ".join(str(meta[k]) for k in ("method", "path") if meta.get(k)))
    if meta.get("host"):
        parts.append(f"{meta['host']} pid {meta.get('pid', '?')}")
    return ", ".join(parts) or "no meta"


admin.site.register(Semaphore, SemaphoreAdmin)
