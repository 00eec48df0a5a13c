"""A small Django project (plain views and DRF views) for the Django and DRF integration tests."""

from __future__ import annotations

import os


def setup() -> None:
    """Configure Django for this process (once; every Django test module calls it)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.integrations.django_project.settings")
    django.setup()
