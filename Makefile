# The two commands: `make run` and `make test`. Both create .venv and install on first use.
PYTHON ?= python3
# A second Django line beside the first, in its own venv, e.g. Django 6.1:
#   make test VENV=.venv-django6 PYTHON=python3.12 DJANGO='django>=6.1,<6.2'
# DJANGO empty (the default): Django 5.2 LTS with the django-tasks backport (the
# "django52" extra); otherwise the requirement to install, and no backport (Django 6
# has django.tasks).
VENV ?= .venv
DJANGO ?=
comma := ,
EXTRAS := dev,site$(if $(DJANGO),,$(comma)django52)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BIND ?= 127.0.0.1:8000
WEB_WORKERS ?= 2
WEB_THREADS ?= 8
WORKER_ARGS ?= --concurrency 2
# `make test` runs the suite in parallel processes (pytest-xdist): most tests wait on real
# worker subprocesses and servers, so more processes than cores still pays. Each process
# gets its own test databases. `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= 4

.PHONY: run test setup install lint docs soak bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' $(if $(DJANGO),'$(DJANGO)')
	touch $(STAMP)

install: $(STAMP)

DOCS_STAMP := $(VENV)/.installed-docs
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),docs]' $(if $(DJANGO),'$(DJANGO)')
	touch $(DOCS_STAMP)

setup: $(STAMP)
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0

# Starts one worker process and gunicorn (settings: gunicorn.conf.py); Ctrl-C stops both
# (the worker gracefully). A worker that dies (a crash, SIGKILL, exit 70 after a hung unit)
# is started again after 2 s, as a service manager would; its jobs resume from their
# checkpoints. A worker that stopped cleanly (exit 0) is not restarted.
run: setup
	$(BIN)/python manage.py ensure_admin
	@echo "Problems dashboard: http://$(BIND)/problems/  (admin site: /admin/; stop with Ctrl-C)"
	@trap 'kill -TERM $$worker 2>/dev/null; wait $$worker' EXIT INT TERM; \
	( trap 'stop=1; kill -TERM $$child 2>/dev/null' TERM; stop=; \
	  while :; do \
	    $(BIN)/python manage.py runworker $(WORKER_ARGS) & child=$$!; \
	    while kill -0 $$child 2>/dev/null; do wait $$child; rc=$$?; done; \
	    if [ -n "$$stop" ] || [ "$$rc" = 0 ]; then exit 0; fi; \
	    echo "make run: the worker exited with status $$rc; starting another in 2 s" >&2; \
	    sleep 2; [ -z "$$stop" ] || exit 0; \
	  done ) & worker=$$!; \
	$(BIN)/gunicorn -c gunicorn.conf.py recovery.wsgi --bind $(BIND) \
		--workers $(WEB_WORKERS) --threads $(WEB_THREADS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP) lint
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python -m pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist worksteal)

# The documentation site (docs/): warnings are errors, then every internal link and
# anchor of the built HTML is checked (no network: external links are not fetched).
docs: $(DOCS_STAMP)
	rm -rf docs/_build/html
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	$(BIN)/python docs/_ext/check_links.py docs/_build/html

# Long torture runs: not part of `make test`.
soak: $(STAMP)
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/writer_turns.py
	FAULT_POINTS_RANDOM_KILLS=15 $(BIN)/python -m pytest tests/integration/test_fault_points.py -q

bench: $(STAMP)
	$(BIN)/python bench/jobs.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/builtin.py

clean:
	rm -rf $(VENV) var/staticfiles var/test-db.sqlite3* docs/_build docs/reference/_generated
