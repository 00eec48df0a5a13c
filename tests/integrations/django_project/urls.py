"""Routes of the test project."""

from django.urls import path

from . import views

urlpatterns = [
    path("items/", views.items, name="items"),
    path("search/", views.search, name="search"),
    path("both/", views.both, name="both"),
    path("reports/a/", views.report_a, name="report-a"),
    path("reports/b/", views.report_b, name="report-b"),
    path("plan/", views.plan, name="plan"),
    path("login/", views.login, name="login"),
    path("etag/", views.etag, name="etag"),
    path("health/", views.health, name="health"),
    path("stream/", views.stream, name="stream"),
    path("async/items/", views.async_items, name="async-items"),
    path("async/search/", views.async_search, name="async-search"),
    path("page/", views.Page.as_view(), name="page"),
    path("decorated/", views.Decorated.as_view(), name="decorated"),
    path("dispatched/", views.Dispatched.as_view(), name="dispatched"),
    path("by-user/a/", views.by_user_a, name="by-user-a"),
    path("by-user/b/", views.by_user_b, name="by-user-b"),
    path("watched/", views.watched, name="watched"),
    path("stacked/", views.stacked, name="stacked"),
    path("compat/limited/", views.compat_limited, name="compat-limited"),
    path("compat/user/", views.CompatUserView.as_view(), name="compat-user"),
    path("api/user/", views.UserView.as_view(), name="api-user"),
    path("api/anon/", views.AnonView.as_view(), name="api-anon"),
    path("api/burst/", views.BurstView.as_view(), name="api-burst"),
    path("api/open/", views.OpenView.as_view(), name="api-open"),
    path("completion/", views.completion, name="completion"),
    path("completion/stream/", views.streamed_completion, name="completion-stream"),
]
