"""URLs of the web-layer tests (included under /web/ with namespace "web")."""

from django.urls import path

from tests.support import views

app_name = "web"

urlpatterns = [
    path("slow/", views.slow, name="slow"),
    path("aslow/", views.aslow, name="aslow"),
    path("cbv/", views.SlowView.as_view(), name="cbv"),
    path("acbv/", views.ASlowView.as_view(), name="acbv"),
    path("queue/", views.queue, name="queue"),
    path("aqueue/", views.aqueue, name="aqueue"),
    path("user/", views.by_user, name="user"),
    path("auser/", views.aby_user, name="auser"),
    path("ip/", views.by_ip, name="ip"),
    path("header/", views.by_header, name="header"),
    path("total/", views.by_tenant_total, name="total"),
    path("override/", views.override, name="override"),
    path("dotted/", views.dotted, name="dotted"),
    path("weighted/", views.weighted, name="weighted"),
    path("weighted-settings/", views.weighted_settings, name="weighted-settings"),
    path("boom/", views.boom, name="boom"),
    path("aboom/", views.aboom, name="aboom"),
    path("stream/", views.stream, name="stream"),
    path("astream/", views.astream, name="astream"),
    path("long/", views.long, name="long"),
    path("along/", views.along, name="along"),
    path("hello/", views.hello, name="hello"),
    path("mw/path/", views.plain, name="mw-path"),
    path("mw/path/probe/", views.probe_plain, name="mw-path-probe"),
    path("mw/apath/", views.aprobe_plain, name="mw-apath"),
    path("pair/xy/", views.pair_xy, name="pair-xy"),
    path("pair/yx/", views.pair_yx, name="pair-yx"),
    path("pair/axy/", views.apair_xy, name="apair-xy"),
    path("mw/await/", views.aplain, name="mw-await"),
    path("mw/named/", views.plain, name="mw-named"),
    path("mw/post/", views.plain, name="mw-post"),
    path("mw/pair/", views.plain, name="mw-pair"),
    path("mw/pair/deco/", views.pair_decorated, name="mw-pair-deco"),
    path("mw/b-only/", views.plain, name="mw-b-only"),
    path("mw/none/", views.plain, name="mw-none"),
]
