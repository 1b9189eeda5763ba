"""A site with the engine alone: ``durable`` without ``recovery`` or ``django_htmx``."""
