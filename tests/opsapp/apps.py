from django.apps import AppConfig


class OpsAppConfig(AppConfig):
    """Test-only models for the built-in database operations (with migrations, because
    they reference ``auth.User`` and PostgreSQL needs that table to exist first)."""

    name = "tests.opsapp"
    label = "opsapp"
    default_auto_field = "django.db.models.BigAutoField"
