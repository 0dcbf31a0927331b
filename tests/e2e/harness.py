"""The distributed run on loopback, for the end-to-end tests: a private Redis, a fresh PostgreSQL database, two
Daphne processes, two Celery workers, one beat and three agents with the process driver, plus the clients a test
drives them with (the REST API with a Bearer token, and signed-in console websockets).

Every process is started in its own session and remembered, so `Cluster.stop()` (called from a finally block
and from atexit) can end each one's whole process group, and the instances the agents started (their own
sessions, on purpose: they outlive an agent) are found by their working directory under this run's temp folder.
A run that leaks a Celery worker or a `sleep 600` would slow every later test on a 2-core machine.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import requests
from psycopg import sql
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from slotkeeper.shutdown import DAPHNE_TIMEOUTS

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
PASSWORD = "e2e-operator-password"
OPERATOR = "e2e-operator"
# What scenario 1 runs: a real process that stays up until it is killed or stopped.
SLEEPER = ["python", "-c", "import time; time.sleep(600)"]

T = TypeVar("T")
_started = time.monotonic()
progress_sink: Callable[[str], None] = print


def say(message: str) -> None:
    """Progress on the terminal (through pytest's capture): a six-minute run must show where it is."""
    progress_sink(f"[e2e {time.monotonic() - _started:6.1f} s] {message}")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.25) -> T:
    """Polls until `predicate` returns something truthy and returns it. A request that fails (a Daphne being
    restarted) counts as "not yet", so a test reads as the sequence of states it waits for."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
        except (requests.RequestException, OSError, psycopg.OperationalError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; last saw: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- processes -----------------------------------------------------------------------------------------------


@dataclass
class Proc:
    """One service process, started in its own session so a kill reaches its children (Celery's pool) too."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        self._signal_group(signal.SIGKILL)
        self._reap(10)

    def stop(self, grace_s: float = 5.0) -> None:
        if self.popen is None:
            return
        self._signal_group(signal.SIGTERM)
        if not self._reap(grace_s):
            self._signal_group(signal.SIGKILL)
            self._reap(5)
        # Celery's pool children share the group; they must not outlive their parent's SIGTERM either.
        self._signal_group(signal.SIGKILL)

    def terminate_timed(self, limit_s: float) -> float | None:
        """SIGTERM to the main process only (what systemd's stop and the kubelet send first) and the seconds it
        took to exit, or None when it was still alive after `limit_s`; then the group is killed either way, so a
        hung process never outlives the test."""
        assert self.popen is not None, f"{self.name} was never started"
        started = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        exited = self._reap(limit_s)
        took = time.monotonic() - started
        self._signal_group(signal.SIGKILL)
        self._reap(5)
        return took if exited else None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def _reap(self, timeout: float) -> bool:
        assert self.popen is not None
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


def processes_under(folder: Path) -> list[psutil.Process]:
    """Processes whose working directory is inside `folder`: the instances this run's agents started."""
    found = []
    prefix = str(folder)
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.cwd().startswith(prefix):
                found.append(proc)
    return found


def instance_processes(folder: Path) -> dict[str, list[psutil.Process]]:
    """Live instance processes of this run by instance id (from the SLOTKEEPER_INSTANCE_ID the driver sets)."""
    out: dict[str, list[psutil.Process]] = {}
    for proc in processes_under(folder):
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            iid = proc.environ().get("SLOTKEEPER_INSTANCE_ID")
            if iid:
                out.setdefault(iid, []).append(proc)
    return out


# -- clients -------------------------------------------------------------------------------------------------


class Api:
    """The REST API as an integration uses it: a Bearer token, JSON in and out, against one Daphne."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path: str, **params: Any) -> Any:
        response = self.session.get(self.base + path, params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict | None = None, headers: dict | None = None) -> requests.Response:
        return self.session.post(self.base + path, json=body or {}, headers=headers, timeout=20)

    def results(self, path: str, **params: Any) -> list[dict]:
        return list(self.get(path, limit=1000, **params)["results"])


class ConsoleSocket:
    """A signed-in console on /ws/console/ that reconnects like the page does, and keeps every event it saw.

    It signs in once (session cookie, as a browser would keep it) and reconnects with the same cookie every
    0.3 s while the connection is down, counting each "hello" as one (re)connection.
    """

    def __init__(self, base: str, *, username: str = OPERATOR, password: str = PASSWORD) -> None:
        self.base = base
        self.username, self.password = username, password
        self.events: list[dict] = []
        self.hellos = 0
        self.errors: list[str] = []
        # The close code of every connection that ended (4013: "try again later", the channel layer is away).
        self.closes: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ws: ClientConnection | None = None
        self._cookie = ""
        self._thread = threading.Thread(target=self._run, name=f"console-{base}", daemon=True)

    def start(self) -> ConsoleSocket:
        self._cookie = self._sign_in()
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.close()
        self._thread.join(5)

    def mark(self) -> int:
        with self._lock:
            return len(self.events)

    def since(self, mark: int = 0) -> list[dict]:
        with self._lock:
            return list(self.events[mark:])

    def saw(self, event: str, mark: int = 0, **match: Any) -> bool:
        return any(
            e.get("event") == event and all(e.get(k) == v for k, v in match.items()) for e in self.since(mark)
        )

    def _sign_in(self) -> str:
        session = requests.Session()
        session.get(self.base + "/login/", timeout=10).raise_for_status()
        response = session.post(
            self.base + "/login/",
            data={
                "username": self.username,
                "password": self.password,
                "csrfmiddlewaretoken": session.cookies["csrftoken"],
            },
            timeout=10,
            allow_redirects=False,
        )
        assert response.status_code == 302, f"console sign-in failed: {response.status_code}"
        return "; ".join(f"{c.name}={c.value}" for c in session.cookies)

    def _run(self) -> None:
        url = "ws" + self.base.removeprefix("http") + "/ws/console/"
        while not self._stop.is_set():
            try:
                with connect(
                    url,
                    origin=self.base,
                    additional_headers={"Cookie": self._cookie},
                    open_timeout=5,
                    close_timeout=1,
                ) as ws:
                    self._ws = ws
                    for raw in ws:
                        self._take(raw)
                if ws.close_code is not None:
                    self.closes.append(ws.close_code)
            except ConnectionClosed as exc:
                self.closes.append(exc.rcvd.code if exc.rcvd is not None else 1006)
                self.errors.append(f"{type(exc).__name__}: {exc}")
            except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self._ws = None
            self._stop.wait(0.3)

    def _take(self, raw: str | bytes) -> None:
        message = json.loads(raw)
        with self._lock:
            if message.get("event") == "hello":
                self.hellos += 1
            elif message.get("event") == "batch":
                # Events come grouped by kind (slotkeeper/livewire.py): put each back as {"event": kind, ...}.
                for kind, items in (message.get("changed") or {}).items():
                    self.events.extend({"event": kind, **item} for item in items)


# -- the cluster ---------------------------------------------------------------------------------------------


@dataclass
class Agent:
    name: str
    work_dir: Path
    proc: Proc
    node_id: int = 0


@dataclass
class Cluster:
    """Everything of one e2e run. `start()` builds it; `stop()` tears it down and is safe to call twice."""

    database_url: str
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="slotkeeper-e2e-")))
    procs: dict[str, Proc] = field(default_factory=dict)
    agents: list[Agent] = field(default_factory=list)
    daphne_urls: list[str] = field(default_factory=list)
    redis_port: int = 0
    token: str = ""
    stopped: bool = False

    # -- life cycle

    def start(self) -> Cluster:
        atexit.register(self.stop)
        self.redis_port = free_port()
        self._start_redis()
        self._fresh_database()
        self.manage("migrate", "-v", "0", timeout=180)
        self.token = self._setup_operator()
        say("database migrated, operator ready")
        for i in (1, 2):
            port = free_port()
            self.daphne_urls.append(f"http://127.0.0.1:{port}")
            self._daphne(i, port).start()
        for i in (1, 2):
            self._worker(i).start()
        self._beat().start()
        for url in self.daphne_urls:
            wait_for(lambda url=url: self._ready(url), 60, f"{url}/readyz")
        say(f"daphnes ready at {', '.join(self.daphne_urls)}")
        for i in (1, 2, 3):
            self._start_agent(i)
        for agent in self.agents:
            wait_for(lambda a=agent: self._registered(a), 30, f"agent {agent.name} to register")
        wait_for(lambda: self.online_nodes() == 3, 30, "3 online nodes")
        for i in (1, 2):
            wait_for(lambda i=i: "ready." in self.procs[f"worker{i}"].log_text(), 60, f"worker{i} ready")
        say(f"cluster up in {self.tmp}: 2 daphne, 2 workers, beat, 3 agents")
        return self

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for proc in reversed(list(self.procs.values())):
            proc.stop()
        for agent in self.agents:
            agent.proc.stop()
        for proc in processes_under(self.tmp):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        say(f"cluster stopped; logs in {self.tmp}")

    def discard(self) -> None:
        """Removes the run's folder (logs and work dirs); kept when a test failed, for the post-mortem."""
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- environment

    @property
    def e2e_database(self) -> str:
        """`<DATABASE_URL's name>_e2e`: two engineers' runs against one PostgreSQL, each with its own
        DATABASE_URL, must not drop each other's database in the middle of a run."""
        return urlsplit(self.database_url).path.lstrip("/") + "_e2e"

    @property
    def e2e_database_url(self) -> str:
        parts = urlsplit(self.database_url)
        return urlunsplit(parts._replace(path=f"/{self.e2e_database}"))

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTEST", "DJANGO_", "DATABASE_URL", "REDIS_URL", "SLOTKEEPER_"))
        }
        env.update(
            DATABASE_URL=self.e2e_database_url,
            REDIS_URL=self.redis_url,
            SECRET_KEY="e2e-only-not-secret",
            EMBEDDED_LOOP="0",
            SLOTKEEPER_OFFLINE_AFTER_S="4",
            SLOTKEEPER_DEAD_AFTER_S="4",
            SLOTKEEPER_HEALTH_MAX_AGE_S="10",
            LOG_FORMAT="plain",
            PYTHONUNBUFFERED="1",
            # The venv first: an instance's "python" must not resolve to a pyenv shim, a bash script that runs
            # pyenv before every start and may pick another interpreter than the one under test.
            PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        env.update(extra)
        return env

    def manage(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def _fresh_database(self) -> None:
        parts = urlsplit(self.database_url)
        admin_url = urlunsplit(parts._replace(path="/postgres"))
        with psycopg.connect(admin_url, autocommit=True) as conn:
            name = sql.Identifier(self.e2e_database)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(name))

    def _setup_operator(self) -> str:
        script = (
            "import json\n"
            "from django.contrib.auth import get_user_model\n"
            "from slotkeeper.management.commands.issue_token import issue\n"
            f"token = issue({OPERATOR!r}, 'operator')\n"
            f"user = get_user_model().objects.get(username={OPERATOR!r})\n"
            f"user.set_password({PASSWORD!r})\n"
            "user.save(update_fields=['password'])\n"
            "print('E2E' + json.dumps(token))\n"
        )
        out = self.manage("shell", "-c", script)
        return str(json.loads(next(line for line in out.splitlines() if line.startswith("E2E"))[3:]))

    # -- services

    def _add(self, name: str, argv: list[str], **env: str) -> Proc:
        proc = Proc(name, argv, self.env(**env), self.tmp / f"{name}.log")
        self.procs[name] = proc
        return proc

    def _start_redis(self) -> None:
        argv = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--daemonize", "no", "--dir", str(self.tmp)]
        self._add("redis", argv).start()
        wait_for(self.redis_up, 15, f"redis on port {self.redis_port}")

    def restart_redis(self) -> None:
        self.procs["redis"].start()
        wait_for(self.redis_up, 15, "redis back")

    def redis_up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.redis_port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def redis_command(self, *words: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(self.redis_port), *words], capture_output=True, text=True, timeout=10
        )
        return done.stdout.strip()

    def _daphne(self, i: int, port: int) -> Proc:
        argv = [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            *DAPHNE_TIMEOUTS,
            "slotkeeper.asgi:application",
        ]
        return self._add(f"daphne{i}", argv, PGAPPNAME=f"e2e-daphne{i}")

    def _worker(self, i: int) -> Proc:
        argv = [str(VENV_BIN / "celery"), "-A", "slotkeeper", "worker", "-l", "info", "--concurrency", "1"]
        argv += ["-n", f"w{i}@%h", "--without-mingle", "--without-gossip"]
        # PGAPPNAME names the worker's database sessions, so a test can see which worker is mid-transaction.
        # REMAP_SIGTERM as deploy/ sets it: SIGTERM is Celery's bounded soft-then-cold shutdown.
        return self._add(f"worker{i}", argv, PGAPPNAME=f"e2e-worker{i}", REMAP_SIGTERM="SIGQUIT")

    def _beat(self) -> Proc:
        argv = [str(VENV_BIN / "celery"), "-A", "slotkeeper", "beat", "-l", "info"]
        return self._add("beat", [*argv, "--schedule", str(self.tmp / "beat")])

    def restart(self, name: str) -> None:
        self.procs[name].start()

    def restart_worker(self, name: str) -> None:
        """Starts a killed worker again and waits for its "ready." (the log is appended to, so count them)."""
        log = self.procs[name].log_text
        before = log().count("ready.")
        self.restart(name)
        wait_for(lambda: log().count("ready.") > before, 60, f"{name} ready again")

    def bring_back(self, name: str) -> None:
        """Starts a killed Daphne or worker again and waits until it serves (`/readyz`) or consumes ("ready.")."""
        if name.startswith("worker"):
            self.restart_worker(name)
            return
        self.restart(name)
        url = self.daphne_urls[int(name.removeprefix("daphne")) - 1]
        wait_for(lambda: self._ready(url), 60, f"{name} ready again")

    def _ready(self, url: str) -> bool:
        return requests.get(url + "/readyz", timeout=2).json().get("ready") is True

    # -- agents

    def _start_agent(self, i: int) -> None:
        work_dir = self.tmp / f"agent{i}"
        work_dir.mkdir()
        name = f"e2e-node{i}"
        # Agents talk to the second Daphne only: the Daphne fault test kills the first, and agents cut off from
        # their server for 8 s would be declared dead, which is a different scenario (3).
        argv = [*self._agent_argv(work_dir), "--register", name]
        proc = Proc(
            f"agent{i}", argv, self.env(SLOTKEEPER_OPERATOR_TOKEN=self.token), self.tmp / f"agent{i}.log"
        )
        self.agents.append(Agent(name, work_dir, proc.start()))

    def _agent_argv(self, work_dir: Path) -> list[str]:
        server = self.daphne_urls[1]
        return [
            str(VENV_BIN / "slotkeeper-agent"),
            "--server",
            server,
            "--work-dir",
            str(work_dir),
            "--interval",
            "1",
        ]

    def _registered(self, agent: Agent) -> bool:
        id_file = agent.work_dir / "node-id"
        if not id_file.exists():
            if not agent.proc.alive():
                raise AssertionError(f"agent {agent.name} exited:\n{agent.proc.log_text()[-2000:]}")
            return False
        agent.node_id = int(id_file.read_text().strip())
        return True

    def restart_agent(self, agent: Agent) -> None:
        """The same node again: the saved id and token, no registration."""
        agent.proc.argv = self._agent_argv(agent.work_dir)
        agent.proc.start()

    def agent_of(self, node_id: int) -> Agent:
        return next(a for a in self.agents if a.node_id == node_id)

    # -- reading the run

    def api(self, which: int = 0) -> Api:
        return Api(self.daphne_urls[which], self.token)

    def console(self, which: int) -> ConsoleSocket:
        return ConsoleSocket(self.daphne_urls[which]).start()

    def websocket_clients(self, which: int) -> float:
        """One Daphne's slotkeeper_websocket_clients gauge, from its /metrics."""
        text = requests.get(self.daphne_urls[which] + "/metrics", timeout=5).text
        found = [
            line.split()[-1] for line in text.splitlines() if line.startswith("slotkeeper_websocket_clients")
        ]
        return float(found[0]) if found else 0.0

    def online_nodes(self) -> int:
        return sum(1 for n in self.api(1).results("/api/nodes/") if n["status"] == "online")

    def sql(self, query: str, *params: Any) -> list[tuple]:
        with psycopg.connect(self.e2e_database_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def invariants(self) -> dict[str, list]:
        """The invariant queries, run by Django against the e2e database (the overcommit query is the one the
        concurrency tests use, tests/leases/invariants.py), plus no instance running twice on this machine."""
        out = self.manage("shell", "-c", INVARIANTS, timeout=60)
        found = json.loads(next(line for line in out.splitlines() if line.startswith("E2E"))[3:])
        running = instance_processes(self.tmp)
        found["instances_running_twice"] = sorted(iid for iid, procs in running.items() if len(procs) > 1)
        return found


INVARIANTS = """
import json
from django.db import connection
from tests.leases.invariants import overcommitted_instants

def rows(query):
    with connection.cursor() as cursor:
        cursor.execute(query)
        return [list(r) for r in cursor.fetchall()]

print("E2E" + json.dumps({
    "overcommitted": [list(r) for r in overcommitted_instants()],
    # Two live instances standing for one vnode would run the same work twice.
    "vnodes_run_twice": rows(
        "SELECT lease_id, vnode, COUNT(*) FROM leases_instance"
        " WHERE state IN ('placed','fetching','verified','loaded','running','unhealthy','restarting')"
        " GROUP BY lease_id, vnode HAVING COUNT(*) > 1"
    ),
    "live_instances_of_ended_leases": rows(
        "SELECT i.iid, i.state, l.state FROM leases_instance i JOIN leases_lease l ON l.id = i.lease_id"
        " WHERE i.state IN ('placed','fetching','verified','loaded','running','unhealthy','restarting')"
        " AND l.state <> 'active'"
    ),
    # A reservation that should have ended 20 s ago and is still live means the ticks stopped doing their job.
    "overdue_reservations": rows(
        "SELECT rid, lease_id, status, \\"end\\" FROM leases_reservation"
        " WHERE status IN ('scheduled','active') AND \\"end\\" < now() - interval '20 seconds'"
    ),
    "open_transactions": rows(
        "SELECT application_name, state, now() - xact_start FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND xact_start < now() - interval '30 seconds'"
    ),
}, default=str))
"""


@contextlib.contextmanager
def consoles(cluster: Cluster) -> Iterator[tuple[ConsoleSocket, ConsoleSocket]]:
    """One signed-in console on each Daphne, closed afterwards."""
    a, b = cluster.console(0), cluster.console(1)
    try:
        wait_for(lambda: a.hellos and b.hellos, 20, "both consoles to connect")
        yield a, b
    finally:
        a.close()
        b.close()


def lease_body(name: str, *, driver: str = "process", **overrides: Any) -> dict:
    body: dict[str, Any] = {
        "name": name,
        "type": "immediate",
        "duration_s": 900,
        "nodes": [{"cpu_cores": 0.1, "mem_mib": 64}],
        "driver": driver,
        "restart_policy": {"max_restarts": 5, "backoff_initial_s": 0, "backoff_max_s": 1},
    }
    if driver == "process":
        body["spec"] = {"command": SLEEPER, "stop_grace_s": 2}
    body.update(overrides)
    return body
