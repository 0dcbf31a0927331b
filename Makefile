# Slotkeeper. `make run` starts the embedded console with a demo fleet; `make test` runs the tests.
# Every target installs first when .venv is missing.
PY      := .venv/bin/python
VENV    := .venv/.installed
PYTHON  ?= python3
PORT    ?= 8000

.PHONY: install run test lint schema bench clean chromium

$(VENV): pyproject.toml
	$(PYTHON) -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet -e '.[dev,plot]'
	touch $(VENV)

install: $(VENV)

run: $(VENV)
	$(PY) manage.py demo --port $(PORT)

# On every core (pytest-xdist); the end-to-end tests share one cluster, so they run on one worker (loadgroup).
test: $(VENV) chromium
	$(PY) -m pytest -n auto --dist loadgroup --durations=10 $(PYTEST_ARGS)

# The browser tests drive Debian's Chromium: installed when missing and this user may (root with apt-get);
# otherwise they are skipped with that reason.
chromium:
	@command -v chromium > /dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1 \
	  && (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null) \
	  || echo "chromium not installed: the browser tests will be skipped (apt-get install chromium)"; }

lint: $(VENV)
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports
	$(PY) manage.py check --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) manage.py spectacular --validate --fail-on-warn --file .schema.check.yaml
	@diff -u docs/openapi.yaml .schema.check.yaml > /dev/null || (echo "docs/openapi.yaml is stale: run 'make schema' and commit it"; diff -u docs/openapi.yaml .schema.check.yaml | head -40; rm -f .schema.check.yaml; exit 1)
	@rm -f .schema.check.yaml

schema: $(VENV)
	$(PY) manage.py spectacular --validate --fail-on-warn --file docs/openapi.yaml

bench: $(VENV)
	$(PY) bench/run_all.py

clean:
	rm -rf .venv *.egg-info .pytest_cache .ruff_cache .mypy_cache slotkeeper.sqlite3 .test.sqlite3
