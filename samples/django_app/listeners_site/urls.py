from django.urls import path

from . import views

urlpatterns = [
    path("listeners", views.listeners),
    path("listeners/<str:execution_id>", views.listener_status),
    path("listeners/<str:execution_id>/messages", views.send_message),
    path("listeners/<str:execution_id>/stop", views.stop_listener),
    path("approvals", views.approvals),
    path("approvals/<str:execution_id>/<str:verb>", views.answer_approval),
]
