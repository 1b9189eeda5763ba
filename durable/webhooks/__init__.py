"""Webhook endpoints and their deliveries.

``policy`` holds the pure rules (filters, signatures, idempotency keys),
``operations`` the delivery operation. Events are published with
``durable.notify.publish`` and delivered again with ``durable.notify.redeliver``;
the models are in ``durable.models.webhooks``.
"""
