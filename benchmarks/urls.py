from django.urls import path

from . import views

urlpatterns = [
    path("plain/", views.plain),
    path("guarded/", views.guarded),
    path("aplain/", views.aplain),
    path("aguarded/", views.aguarded),
    path("pinged/", views.pinged),
    path("apinged/", views.apinged),
]
