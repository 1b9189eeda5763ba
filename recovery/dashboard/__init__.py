"""The Problems dashboard: Summary, Recovery, Security and Jobs pages under ``/problems/``.

Pure decisions (query strings, search patterns, paging, formatting, the chart,
the client address) live in their own modules without ORM or clock reads and
are table-tested in ``tests/unit``; the views only read the database and render.
"""
