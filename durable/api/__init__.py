"""A JSON API for durable jobs: idempotent submission, event streams, schedules, client tokens.

Mount it with ``path("api/", include("durable.api.urls"))``. Other programs (a
CI system, a deploy script) submit jobs and follow them over HTTP; every state
change still goes through ``durable.jobs``, so the API can do nothing the
dashboard and the worker could not.

Layout: ``parse`` holds the pure decisions (headers, bodies, query strings,
cursors, SSE framing), ``tokens`` the token format, ``models`` the clients and
idempotency keys, ``auth`` (tokens, scopes, ``Operation.access``) and
``submission`` the I/O around them, ``render`` the JSON shapes, ``views`` the
HTTP surface for jobs, ``schedule_views`` the one for scheduled rules (through
``durable.schedules.service``) and ``openapi`` their description.
"""
