"""Restart-safe durable jobs for Django.

Public API (import from the submodules; they are stable):

- ``durable.operations``: ``Operation``, ``Unit``, ``register`` — declare work.
- ``durable.jobs``: ``enqueue``, ``pause``, ``resume``, ``cancel``, ``retry_now``.
- ``durable.errors``: ``RetryLater``, ``NonRetryable``, ``Unavailable`` — what a
  unit raises to steer the engine.
- ``durable.signals``: what the engine announces (reclaims, failures, refusals).
"""
