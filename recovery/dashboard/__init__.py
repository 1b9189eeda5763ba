"""The Problems dashboard: Summary, Recovery, Security and Jobs pages under ``/problems/``.

Pure decisions (query strings, search patterns, paging, formatting, the chart,
the client address) live in their own modules without ORM or clock reads and
are table-tested in ``tests/unit``; the views only read the database and render.

Imports go one way, top to bottom (``tests/unit/test_architecture.py``):

- views, one module per page or group of pages, routed by ``urls``: ``views``
  (Summary, Recovery, Security, login), ``jobs``, ``job_actions``,
  ``job_bulk``, ``new_job``, ``console`` (Queues, Workers), ``schedules``,
  ``record``. None imports another;
- what several views share: ``context`` (every page's context, the throughput
  chart's), ``responses`` (page or htmx fragment), ``forms``,
  ``operation_picker``, ``job_context``, ``engine_actions``, ``serving``;
- reads and rules: ``access``/``rights``, ``listing``/``query``/``sql``,
  ``rollup``/``throughput``/``chart``, ``actions``, ``audit``, ``formatting``;
  and the site's operations (``bulk``, ``indexing``).

A new page is a view in the top layer (and a route); a helper a second page
needs moves down a layer rather than being imported from the first page.
"""
