"""Slotkeeper settings: one file, driven by the environment.

Embedded (default): SQLite in the project folder, the in-memory channel layer, periodic work in a loop inside
the web process. Distributed: set DATABASE_URL (PostgreSQL) and REDIS_URL (channel layer + Celery broker).
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.management.utils import get_random_secret_key

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_seconds(name: str, default: float, *, at_least: float) -> float:
    """A duration in seconds from the environment, refused at start-up (with the variable's name) when it is not
    a number or shorter than `at_least`."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= at_least:  # also refuses nan
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(f"{name} must be a number of seconds, at least {at_least:g}; got {raw!r}")
    return value


DEBUG = env_bool("DEBUG", False)

# Replacements of framework behaviour (docs/overrides.md), each turned off by name to compare it with the framework's
# own path in one run: SLOTKEEPER_OVERRIDES_OFF=handler,renderer. Read once at start-up; an unknown name is refused
# (a typo would otherwise measure the override against itself). For measuring, not for production.
OVERRIDES = frozenset(
    {
        "handler",
        "handler_threads",
        "handler_one_hop",
        "raw_body",
        "heartbeat_route",
        "collector",
        "statements",
        "prepared",
        "bulk",
        "renderer",
        "release_rendered",
    }
)
OVERRIDES_OFF = frozenset(
    name.strip() for name in os.environ.get("SLOTKEEPER_OVERRIDES_OFF", "").split(",") if name.strip()
)
if OVERRIDES_OFF - OVERRIDES:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"SLOTKEEPER_OVERRIDES_OFF names no override {sorted(OVERRIDES_OFF - OVERRIDES)}; known: {sorted(OVERRIDES)}"
    )


# A missing SECRET_KEY is fine for a laptop demo but never for production: the key is generated per process and
# kept in a file beside the database, so sessions survive a restart of `make run` without a committed secret.
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY and os.environ.get("REDIS_URL"):
    # Distributed means several processes on several machines: a per-process key would break every session and
    # CSRF token that crosses replicas. Refuse to start instead of failing one request in N.
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("SECRET_KEY must be set when REDIS_URL is (the distributed run).")
if not SECRET_KEY:
    _key_file = BASE_DIR / ".secret_key"
    if _key_file.exists():
        SECRET_KEY = _key_file.read_text().strip()
    else:
        SECRET_KEY = get_random_secret_key()
        try:
            _key_file.write_text(SECRET_KEY)
            _key_file.chmod(0o600)
        except OSError:
            pass

ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_htmx",
    "slotkeeper",
    "fleet",
    "leases",
    "leases.instances",
]

MIDDLEWARE = [
    "slotkeeper.ops.ProbeMiddleware",
    "slotkeeper.middleware.RefuseNulMiddleware",
    "slotkeeper.logging.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "slotkeeper.ops.BusyMiddleware",
    *([] if "release_rendered" in OVERRIDES_OFF else ["slotkeeper.middleware.ReleaseRenderedMiddleware"]),
]

ROOT_URLCONF = "slotkeeper.urls"
ASGI_APPLICATION = "slotkeeper.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "slotkeeper.context.console",
            ],
        },
    },
]

DATABASE_URL = os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'slotkeeper.sqlite3'}")
# Daphne runs each request's sync view on a thread of its own (kept idle for a later request, up to
# slotkeeper/handler.py KEPT_THREADS, and made anew past that), so persistent connections (CONN_MAX_AGE > 0) pile
# up one per thread until PostgreSQL refuses more ("too many clients": 38 % of heartbeats failed that way under
# load, measured, when every request had a new thread).
# On PostgreSQL the pool below keeps connections instead; without it (DB_POOL=0) DB_CONN_MAX_AGE may be raised.
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=int(os.environ.get("DB_CONN_MAX_AGE", "0")))
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the console read while the scheduler writes; IMMEDIATE makes every write transaction take the
    # write lock up front, which is how the plan applier is serialised on SQLite (no "database is locked" upgrade
    # failures half-way through a transaction).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # One test database file per process, so two test runs on one machine (a developer's and CI's, or parallel
    # runs) never share, and corrupt, one file.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / f".test-{os.getpid()}.sqlite3")}
IS_POSTGRES = DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql")
# PostgreSQL: Django's connection pool (psycopg-pool), one per process. A request borrows a connection for its
# duration and gives it back, so the server holds at most DB_POOL_MAX_SIZE connections per process however many
# threads Daphne runs views on; a request that finds the pool empty waits up to DB_POOL_TIMEOUT_S, then is answered
# 503 with Retry-After (slotkeeper/planlock.py is_busy_error), never "too many clients". Size it so that every
# process's maximum fits under PostgreSQL's max_connections (100 by default): 2 Daphne + 2 workers + beat at the
# default 10 is 50. The pool requires CONN_MAX_AGE 0 (its connections are kept by the pool, not by the thread).
# DB_POOL=0 turns it off (e.g. behind PgBouncer), and only then may DB_CONN_MAX_AGE be raised.
DB_POOL = IS_POSTGRES and env_bool("DB_POOL", True)
# PostgreSQL: the few statements every API request runs (a token's lookup, a lease and its report read back, the
# fleet's node shapes; slotkeeper/statements.py templates) are prepared once per connection, so the server plans
# them once instead of on every request (planning the token's lookup cost more than running it). Everything else
# keeps Django's client-side binding. A pooler in transaction mode that cannot carry prepared statements
# (PgBouncer before 1.21) needs DB_PREPARED_STATEMENTS=0.
DB_PREPARED_STATEMENTS = (
    IS_POSTGRES and env_bool("DB_PREPARED_STATEMENTS", True) and "prepared" not in OVERRIDES_OFF
)
if DB_PREPARED_STATEMENTS:
    # Prepared only where asked (execute(prepare=True) on a server-binding cursor), never by count: Django's own
    # cursors bind on the client and are never prepared.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 2**31 - 1
if DB_POOL:
    if DATABASES["default"]["CONN_MAX_AGE"]:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "DB_CONN_MAX_AGE must be 0 with the connection pool; set DB_POOL=0 to raise it."
        )
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": int(os.environ.get("DB_POOL_MIN_SIZE", "2")),
        "max_size": int(os.environ.get("DB_POOL_MAX_SIZE", "10")),
        "timeout": float(os.environ.get("DB_POOL_TIMEOUT_S", "10")),
        # Named, so pg_stat_activity and the pool's logs say whose connections these are.
        "name": "slotkeeper",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "staticfiles"))

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads it to send X-CSRFToken
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

REDIS_URL = os.environ.get("REDIS_URL", "")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # The test suite runs on several workers at once (pytest-xdist), each with its own database: each has
            # its own prefix in Redis too, or one worker's broadcasts reach another's consoles.
            "CONFIG": {
                "hosts": [REDIS_URL],
                "capacity": 1500,
                "expiry": 10,
                "prefix": "asgi"
                + (f"-{_worker}" if (_worker := os.environ.get("PYTEST_XDIST_WORKER")) else ""),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: the broker is Redis when distributed. Embedded, there is no broker; the periodic work runs in a loop
# inside the web process (slotkeeper.embedded) and tasks called with .delay() run eagerly.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A bounded stop. Workers run with REMAP_SIGTERM=SIGQUIT (deploy/, the e2e harness), so SIGTERM starts Celery's cold
# shutdown, soft first: the task in hand gets this long to finish, then it is cancelled and, acknowledged only late
# (above), redelivered; a tick is one transaction and idempotent, so it is rolled back and runs again. A plain warm
# shutdown waits for the task however long it takes: a tick blocked on the plan lock held the stop indefinitely.
# 4 s: the cold shutdown after it took about 3 s in tests/e2e/test_shutdown.py, and the whole stop must fit in 10.
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = 4.0
CELERY_TIMEZONE = "UTC"
# How often the periodic work looks for placement reports past their retention (SLOTKEEPER below).
RETENTION_EVERY_S = env_seconds("SLOTKEEPER_RETENTION_EVERY_S", 60, at_least=1)
# `expires`: a tick that waited longer than its period is pointless, so ticks queued while every worker was down
# are dropped instead of running back to back when the workers return.
CELERY_BEAT_SCHEDULE = {
    "sweep-nodes": {
        "task": "leases.instances.tasks.sweep_nodes",
        "schedule": 5.0,
        "options": {"expires": 10},
    },
    "tick-leases": {"task": "leases.instances.tasks.tick", "schedule": 5.0, "options": {"expires": 10}},
    "retain-reports": {
        "task": "leases.instances.tasks.retain_reports",
        "schedule": RETENTION_EVERY_S,
        "options": {"expires": 60},
    },
}

# Run the periodic work inside the web process (embedded mode). Off when REDIS_URL is set (beat does it) and
# in tests, which call the actions directly with an injected clock.
EMBEDDED_LOOP = env_bool("EMBEDDED_LOOP", not REDIS_URL)
EMBEDDED_LOOP_INTERVAL_S = float(os.environ.get("EMBEDDED_LOOP_INTERVAL_S", "2"))

# Metrics (docs/metrics.md). Where each process keeps its series is PROMETHEUS_MULTIPROC_DIR, read by
# prometheus-client and slotkeeper/metrics.py before settings are. A Celery worker serves its processes' series on
# this port when it is set (a worker in a container or pod of its own, which no Daphne shares a directory with);
# 0: it serves none, and the Daphnes sharing its directory do.
METRICS_PORT = int(os.environ.get("SLOTKEEPER_METRICS_PORT", "0"))

SLOTKEEPER = {
    # A node is offline once its last heartbeat is this old, and dead after the grace on top of that.
    "OFFLINE_AFTER_S": float(os.environ.get("SLOTKEEPER_OFFLINE_AFTER_S", "20")),
    "DEAD_AFTER_S": float(os.environ.get("SLOTKEEPER_DEAD_AFTER_S", "60")),
    # Health older than this makes a node ineligible for placement (seed 001: fail closed).
    "HEALTH_MAX_AGE_S": float(os.environ.get("SLOTKEEPER_HEALTH_MAX_AGE_S", "30")),
    # How long a reschedule proposal keeps its target's room held for the lost instance before the tick releases
    # it and proposes again against the fleet as it is (leases/instances/actions/reschedules.py).
    "RESCHEDULE_HOLD_S": env_seconds("SLOTKEEPER_RESCHEDULE_HOLD_S", 900, at_least=10),
    # How long the event feed keeps events (slotkeeper/outbox.py): a client resuming from an older one gets 410.
    "EVENT_RETENTION_S": env_seconds("SLOTKEEPER_EVENT_RETENTION_S", 7 * 86400, at_least=60),
    # A lease's `lease.ending` notice, when its request does not say (`notify_before_s`; 0: none).
    "NOTIFY_BEFORE_S": env_seconds("SLOTKEEPER_NOTIFY_BEFORE_S", 600, at_least=0),
    # Health history kept for the charts (one hour: 720 samples a node at the agent's 5 s interval).
    "HEALTH_HISTORY_S": float(os.environ.get("SLOTKEEPER_HEALTH_HISTORY_S", "3600")),
    # At most one history sample per node this often: the latest report is always on the node row, and a chart
    # of the last hour needs no more (at 10,000 nodes every 5 s, one row per heartbeat was 7.2 million an hour).
    "HEALTH_SAMPLE_EVERY_S": float(os.environ.get("SLOTKEEPER_HEALTH_SAMPLE_EVERY_S", "30")),
    # How long placement reports are kept (leases/instances/actions/retention.py): a preview's, whose answer was
    # given inline, and a decision's, which is kept longer still while its lease is not final or a pending
    # reschedule points at it. At least an hour each: a request's waiter reads its report after the decision.
    "PREVIEW_REPORT_RETENTION_S": env_seconds("SLOTKEEPER_PREVIEW_REPORT_RETENTION_S", 86400, at_least=3600),
    "REPORT_RETENTION_S": env_seconds("SLOTKEEPER_REPORT_RETENTION_S", 30 * 86400, at_least=3600),
    "RETENTION_EVERY_S": RETENTION_EVERY_S,
    # Node tokens each web process remembers (slotkeeper/auth.py node_tokens), and for how long: a heartbeat from a
    # node seen within the TTL skips the token lookup. Every use is checked against the node row in the same
    # statement (for a buffered heartbeat, the flush's), so the TTL bounds memory, not how long a rotated or fenced
    # token is accepted: never in the process that rotated or fenced it; in the others until its NOTIFY arrives
    # (milliseconds; fleet/token_notices.py), at most one heartbeat flush interval if that notice is missed.
    "NODE_TOKEN_CACHE_SIZE": int(os.environ.get("SLOTKEEPER_NODE_TOKEN_CACHE_SIZE", "20000")),
    "NODE_TOKEN_CACHE_TTL_S": float(os.environ.get("SLOTKEEPER_NODE_TOKEN_CACHE_TTL_S", "30")),
    # The steady heartbeat answered in front of Django and written in batches (slotkeeper/heartbeat_route.py):
    # off (0) sends every heartbeat through the view and writes it in its request, as before. The flush interval
    # is also what a crash may lose (docs/heartbeats.md).
    "HEARTBEAT_BUFFER": os.environ.get("SLOTKEEPER_HEARTBEAT_BUFFER", "1") == "1"
    and "heartbeat_route" not in OVERRIDES_OFF,
    "HEARTBEAT_FLUSH_S": float(os.environ.get("SLOTKEEPER_HEARTBEAT_FLUSH_S", "0.15")),
    # A sweep that finds its previous run older than this was away (the server or beat was down): every node gets
    # a fresh grace from then, instead of being found dead for the sweep's own absence.
    "SWEEP_OUTAGE_GAP_S": float(os.environ.get("SLOTKEEPER_SWEEP_OUTAGE_GAP_S", "15")),
    # When more than this share of the fleet (of at least DISRUPTION_MIN_NODES) is silent at once, nodes are
    # marked offline but none is declared dead until the disruption ends (Kubernetes uses 0.55 for a zone).
    "DISRUPTION_SHARE": float(os.environ.get("SLOTKEEPER_DISRUPTION_SHARE", "0.55")),
    "DISRUPTION_MIN_NODES": int(os.environ.get("SLOTKEEPER_DISRUPTION_MIN_NODES", "3")),
    # The longest any request waits for the plan lock before it is answered 503 with Retry-After.
    "PLAN_LOCK_TIMEOUT_S": float(os.environ.get("SLOTKEEPER_PLAN_LOCK_TIMEOUT_S", "10")),
    # A young-generation collection every this many allocations once a server process has started, and what
    # start-up built frozen out of the collector's view (slotkeeper/collector.py); 0 keeps CPython's defaults.
    "GC_THRESHOLD": 0
    if "collector" in OVERRIDES_OFF
    else int(os.environ.get("SLOTKEEPER_GC_THRESHOLD", "10000")),
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "slotkeeper.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["slotkeeper.auth.IsViewer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "slotkeeper.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "slotkeeper.api.exception_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer"
        if "renderer" in OVERRIDES_OFF
        else "slotkeeper.renderers.FastJSONRenderer"
    ],
    # JSON only, bounded in size and depth (slotkeeper/parsers.py). Form bodies never worked with the strict fields
    # (every number arrived as a string), yet the schema offered them to every client.
    "DEFAULT_PARSER_CLASSES": ["slotkeeper.parsers.BoundedJSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

# The largest request body the API reads (Django's default, stated here because the API answers it with a 413:
# slotkeeper/parsers.py and slotkeeper/api.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440

SPECTACULAR_SETTINGS = {
    "TITLE": "Slotkeeper API",
    "DESCRIPTION": "Leases of node capacity, the slot table, the fleet and its placer.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["slotkeeper.auth.IsViewer"],
    # Swagger UI and ReDoc from our own static files (drf-spectacular-sidecar), not a CDN: consoles run on closed
    # networks, where /api/docs/ was a blank page.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "slotkeeper.schema.document_error_responses",
        "slotkeeper.schema.integer_path_ids",
        "slotkeeper.schema.strings_as_read",
        "slotkeeper.schema.inline_bodies_required",
    ],
    "ENUM_NAME_OVERRIDES": {
        "NodeStatusEnum": "fleet.models.NodeStatus",
        "ReservationStatusEnum": "leases.models.ReservationStatus",
        "LeaseStateEnum": "leases.models.LEASE_STATE_CHOICES",
        "InstanceStateEnum": "leases.models.INSTANCE_STATE_CHOICES",
    },
}

LOG_FORMAT = os.environ.get("LOG_FORMAT", "json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "request_id": {"()": "slotkeeper.logging.RequestIdFilter"},
        "expected_answers": {"()": "slotkeeper.logging.ExpectedAnswersFilter"},
    },
    "formatters": {
        "json": {"()": "slotkeeper.logging.JsonFormatter"},
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT if LOG_FORMAT in {"json", "plain"} else "json",
            "filters": ["expected_answers", "request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}
