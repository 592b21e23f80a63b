"""Settings of the sample: an API only (no database, no sessions, no templates).

A real deployment adds authentication (and CSRF protection for browser clients) in front of
these views; the sample keeps to what shows the runtime's use.
"""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-sample-only")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["listeners_site.apps.ListenersConfig"]
MIDDLEWARE: list = []
ROOT_URLCONF = "listeners_site.urls"
DATABASES: dict = {}
USE_TZ = True
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"pid": {"format": "%(asctime)s pid %(process)d %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "pid"}},
    "loggers": {
        "conductor_agents": {"handlers": ["console"],
                             "level": os.environ.get("LISTENERS_SITE_SDK_LOG_LEVEL", "WARNING")},
        "django.request": {"handlers": ["console"], "level": "ERROR"},  # a view that raised, with its traceback
    },
}
