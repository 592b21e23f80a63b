#!/usr/bin/env python
"""Django's command line for the sample (``python manage.py runserver`` serves it in one process)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "listeners_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
