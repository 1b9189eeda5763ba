"""A Django task for the engine-alone site (the framework from whichever Django has it)."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b
