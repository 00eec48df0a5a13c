"""Settings of the test project; tests change RATEKEEPER with ``override_settings``."""

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.integrations.django_project.urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"]
MIDDLEWARE = [
    "tests.integrations.django_project.auth.header_user",
    "ratekeeper.integrations.django.RateLimitMiddleware",
]
DATABASES: dict[str, object] = {}
USE_TZ = True
RATEKEEPER = {"DEFAULT": "3/minute"}
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tests.integrations.django_project.auth.HeaderAuth"],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_THROTTLE_RATES": {"user": "3/minute", "anon": "2/minute", "burst": "2/minute"},
}
