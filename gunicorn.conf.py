"""gunicorn's settings for this site: ``make run``, the tests and production all read this file.

gunicorn loads ``./gunicorn.conf.py`` by itself when started in the project
directory (elsewhere: ``gunicorn -c /path/to/gunicorn.conf.py``); options on
the command line override it. Why these values:

- **gthread workers.** An event stream (``GET /api/jobs/<id>/events`` with
  ``Accept: text/event-stream``) holds whatever serves it for up to
  ``DURABLE_API_STREAM_SECONDS``. A sync worker serves one request at a time,
  so two followers would take both processes of ``make run`` and the
  dashboard would wait. Here each process has ``WEB_THREADS`` threads, and the
  API lets at most ``DURABLE_API_MAX_STREAMS`` of them stream at once (more
  get ``503`` with ``Retry-After``), so a page always finds a free thread.
- **An access log without credentials.** gunicorn's default format starts with
  ``%(u)s``, the user name of a ``Basic`` Authorization header: a client that
  sends its token as ``curl -u "$TOKEN:"`` would have it written in clear
  (the API refuses it, but only after the line is logged). The request line
  ``%(r)s`` carries the query string, where a client may put a token
  (``?access_token=``) or a search; the referrer carries another page's.
  This format logs the path without query string and neither of the others.
"""

import os

wsgi_app = "recovery.wsgi"
bind = os.environ.get("BIND", "127.0.0.1:8000")
workers = int(os.environ.get("WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("WEB_THREADS", "8"))
timeout = 30
graceful_timeout = 10
accesslog = "-"
# address, time, "METHOD /path PROTOCOL", status, bytes, duration, user agent
access_log_format = '%(h)s %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms "%(a)s"'
