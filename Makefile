# The two commands: `make run` and `make test`. Both create .venv and install on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BIND ?= 127.0.0.1:8000
WEB_WORKERS ?= 2
WEB_THREADS ?= 8
WORKER_ARGS ?= --concurrency 2

.PHONY: run test setup install lint soak bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

setup: $(STAMP)
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0

# Starts one worker process and gunicorn (settings: gunicorn.conf.py); Ctrl-C stops both
# (the worker gracefully).
run: setup
	$(BIN)/python manage.py ensure_admin
	@echo "Problems dashboard: http://$(BIND)/problems/  (admin site: /admin/; stop with Ctrl-C)"
	@trap 'kill -TERM $$worker 2>/dev/null; wait $$worker' EXIT INT TERM; \
	$(BIN)/python manage.py runworker $(WORKER_ARGS) & worker=$$!; \
	$(BIN)/gunicorn -c gunicorn.conf.py recovery.wsgi --bind $(BIND) \
		--workers $(WEB_WORKERS) --threads $(WEB_THREADS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: $(STAMP) lint
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python -m pytest

# Long torture runs: not part of `make test`.
soak: $(STAMP)
	$(BIN)/python bench/soak.py

bench: $(STAMP)
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/builtin.py

clean:
	rm -rf $(VENV) var/staticfiles var/test-db.sqlite3*
