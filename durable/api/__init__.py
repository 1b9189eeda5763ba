"""A JSON API for durable jobs: idempotent submission, event streams, client tokens.

Mount it with ``path("api/", include("durable.api.urls"))``. Other programs (a
CI system, a deploy script) submit jobs and follow them over HTTP; every state
change still goes through ``durable.jobs``, so the API can do nothing the
dashboard and the worker could not.

Layout: ``parse`` holds the pure decisions (headers, bodies, query strings,
cursors, SSE framing), ``tokens`` the token format, ``models`` the clients and
idempotency keys, ``auth`` and ``submission`` the I/O around them, ``render``
the JSON shapes, ``views`` the HTTP surface and ``openapi`` its description.
"""
