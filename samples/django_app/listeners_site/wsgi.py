"""The WSGI application: ``gunicorn listeners_site.wsgi`` (from ``samples/django_app``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "listeners_site.settings")
application = get_wsgi_application()
