from django.contrib import admin
from django.urls import path

from testproject.demo import views

urlpatterns = [
    path("", views.home, name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("report/", views.report, name="report"),
    path("me/", views.per_user, name="per-user"),
    path("api/items/", views.api_items, name="api-items"),
    path("download/", views.download, name="download"),
    path("async/", views.async_work, name="async-work"),
    path("export/", views.export, name="export"),
    path("admin/", admin.site.urls),
]
