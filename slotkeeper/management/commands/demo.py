"""`manage.py demo` (what `make run` calls): migrate, make a demo admin, seed a demo fleet, serve the console with
Daphne on http://127.0.0.1:8000 (`--port`, `make run PORT=…`), and run simulated agents that heartbeat through the
real API. Ctrl-C stops everything it started; on Linux its Daphne also stops when the demo is killed outright, and
a port already in use is refused before anything starts. `SLOTKEEPER_DEMO_DIR` moves `.demo/` (secrets, logs).

The terminal is for a person: Daphne's access log (two lines per agent every 5 s, about five a second) goes to
`.demo/access.log`, the simulated agents' routine events are shown only with `--agent-events`; warnings, errors
and the server's own events stay on screen, and the sign-in is printed again once the start-up burst is over, so
it is not pushed off the screen."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet import actions
from fleet.models import Node
from slotkeeper.demo_load import DEMO_REASON
from slotkeeper.management.commands.issue_token import grant_role, issue
from slotkeeper.shutdown import DAPHNE_TIMEOUTS

# The demo's secrets and logs; another folder for a second demo (or a test) that must not touch this one's tokens.
DEMO_DIR = Path(os.environ.get("SLOTKEEPER_DEMO_DIR") or Path(settings.BASE_DIR) / ".demo")
ASGI_APP = "slotkeeper.asgi:application"
# The sign-in is printed again this long after the server is up: past the agents' first heartbeats, the demo
# integration's first leases and the instances they start.
REMIND_AFTER_S = 20.0

# The three machines measured in seed 001 (tank, architect, morpheus) and nine more of common shapes.
DEMO_FLEET = [
    ("tank", 16, 61440, 1000, ["backend:claude", "backend:local-ornith"]),
    ("architect", 16, 65536, 900, ["backend:claude", "backend:local-ornith"]),
    ("morpheus", 8, 31757, 400, ["backend:claude"]),
    ("gpu-01", 32, 131072, 2000, ["backend:claude", "accel.gpu"]),
    ("gpu-02", 32, 131072, 2000, ["backend:claude", "accel.gpu"]),
    ("edge-cam-01", 4, 16384, 120, ["sensor.camera0"]),
    ("edge-cam-02", 4, 16384, 120, ["sensor.camera0"]),
    ("batch-01", 24, 98304, 1500, []),
    ("batch-02", 24, 98304, 1500, []),
    ("batch-03", 24, 98304, 1500, []),
    ("small-01", 4, 8192, 100, []),
    ("small-02", 4, 8192, 100, []),
]


class DemoFencing(logging.Filter):
    """The demo declares a node dead on purpose every 20 minutes (slotkeeper/demo_load.py) and says so on one line;
    its simulated agent's "node-fenced" error for that node is the expected outcome, not an error to look into, so
    it is not shown again. A node fenced for any other reason still logs its error."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "fields", None) or {}
        return not (record.getMessage() == "node-fenced" and DEMO_REASON in str(fields.get("error", "")))


class Command(BaseCommand):
    help = "Run Slotkeeper embedded with a demo fleet: console at http://127.0.0.1:8000 (Ctrl-C stops it)."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--no-agents", action="store_true", help="serve without simulated agents")
        parser.add_argument(
            "--agent-events",
            action="store_true",
            help="also show every simulated agent's routine events (instance started / ended, node status)",
        )

    def handle(self, port, host, no_agents, agent_events, **options):
        if port_in_use(host, port):
            # Checked before anything starts: Daphne's /healthz would otherwise be answered by whatever holds the
            # port, and the demo said "running" and started its agents against it before Daphne failed to listen.
            raise CommandError(
                f"{host}:{port} is already in use (another Slotkeeper still running?). Stop it, or choose another "
                f"port: make run PORT={port + 1}"
            )
        if not agent_events:
            # Twelve agents in one terminal log an instance start or end every second or two; their warnings
            # and errors (an instance lost, a refused or fenced node) still show.
            logging.getLogger("slotkeeper.agent").setLevel(logging.WARNING)
        logging.getLogger("slotkeeper.agent").addFilter(DemoFencing())
        DEMO_DIR.mkdir(mode=0o700, exist_ok=True)
        self.stdout.write("Migrating the database…")
        call_command("migrate", interactive=False, verbosity=0)
        password = self.demo_admin()
        tokens = self.demo_fleet()
        server = f"http://{host}:{port}"
        access_log = DEMO_DIR / "access.log"
        daphne = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                host,
                "-p",
                str(port),
                "--access-log",
                str(access_log),
                *DAPHNE_TIMEOUTS,
                ASGI_APP,
            ],
            env={**os.environ, "EMBEDDED_LOOP": "1"},
            preexec_fn=die_with_parent(),  # one prctl call in the child; no thread of ours runs yet
        )
        stop = threading.Event()

        def shutdown(*_):
            stop.set()

        signal.signal(signal.SIGINT, shutdown)
        signal.signal(signal.SIGTERM, shutdown)
        try:
            self.wait_until_up(server, daphne)
            # The embedded loop starts with the first request; make it now rather than when someone opens a page.
            urllib.request.urlopen(f"{server}/healthz", timeout=5).read()  # noqa: S310 (our own loopback URL)
            if not no_agents:
                self.start_agents(server, tokens, stop)
                threading.Thread(target=submit_demo_leases, args=(server, stop), daemon=True).start()
            self.stdout.write(
                self.style.SUCCESS(
                    f"\nSlotkeeper is running: {server}/\n"
                    f"  sign in as  admin / {password}   (kept in {DEMO_DIR.name}/admin-password)\n"
                    f"  API docs    {server}/api/docs/   admin {server}/admin/\n"
                    f"  {len(tokens)} simulated agents heartbeat every 5 s; a demo integration submits leases.\n"
                    f"  Requests are logged to {DEMO_DIR.name}/{access_log.name}. Ctrl-C stops everything.\n"
                )
            )
            remind_at = time.monotonic() + REMIND_AFTER_S
            while not stop.is_set() and daphne.poll() is None:
                stop.wait(0.5)
                if remind_at and time.monotonic() >= remind_at:
                    remind_at = 0.0
                    self.stdout.write(self.style.SUCCESS(sign_in_reminder(server, password)))
        finally:
            stop.set()
            if daphne.poll() is None:
                daphne.terminate()
                try:
                    daphne.wait(10)
                except subprocess.TimeoutExpired:
                    daphne.kill()
            self.stdout.write("Stopped.")

    def demo_admin(self) -> str:
        password_file = DEMO_DIR / "admin-password"
        password = os.environ.get("DEMO_ADMIN_PASSWORD") or (
            password_file.read_text().strip() if password_file.exists() else secrets.token_urlsafe(9)
        )
        write_private(password_file, password)
        user, _ = get_user_model().objects.get_or_create(username="admin")
        user.is_superuser = True
        user.set_password(password)
        user.save()
        grant_role(user, "admin")
        return password

    def demo_fleet(self) -> list[tuple[int, str]]:
        """Registers the demo nodes once; keeps their tokens in .demo/ (they are shown only once)."""
        self.fresh_fleet = False
        token_file = DEMO_DIR / "node-tokens.json"
        saved = json.loads(token_file.read_text()) if token_file.exists() else {}
        tokens = []
        self.sizes = {}
        now = timezone.now()
        for name, cores, mem, disk, caps in DEMO_FLEET:
            node = Node.objects.filter(name=name).first()
            if node is None:
                self.fresh_fleet = True
                node, token = actions.do_register_node(
                    None,
                    name=name,
                    cpu_cores=cores,
                    mem_total_mib=mem,
                    disk_total_gib=disk,
                    capabilities=caps,
                    now=now,
                )
            elif name in saved:
                token = saved[name]
            else:
                token = actions.do_rotate_token(None, node.pk, now=now)
            saved[name] = token
            tokens.append((node.pk, token))
            # Its simulated machine is the size it declared, with a tenth of the disk in use.
            self.sizes[node.pk] = (name, mem, cores, disk * 0.9)
        write_private(token_file, json.dumps(saved))
        self.stdout.write(f"Demo fleet: {len(tokens)} nodes.")
        return tokens

    def wait_until_up(self, server: str, daphne: subprocess.Popen) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if daphne.poll() is not None:
                raise SystemExit("Daphne exited; see the log above.")
            try:
                urllib.request.urlopen(f"{server}/healthz", timeout=1).read()  # noqa: S310
                return
            except OSError:
                time.sleep(0.3)
        raise SystemExit("Daphne did not answer within 30 s.")

    def start_agents(self, server: str, tokens, stop: threading.Event) -> None:
        # Imported here: the agent (psutil, its drivers) is only needed once the demo starts its simulated fleet.
        from fleet.agent.main import SimProfile, run_simulated_agents

        work_root = DEMO_DIR / "agents"
        if self.fresh_fleet and work_root.exists():
            # A new database: the agents' state files speak of instances that no longer exist anywhere.
            shutil.rmtree(work_root)
        run_simulated_agents(
            server,
            tokens,
            stop,
            interval=5.0,
            work_root=work_root,
            sizes={pk: SimProfile(*size) for pk, size in self.sizes.items()},
        )


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As Daphne binds: a port left in TIME_WAIT by a server that just stopped is free, a listening one is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent():
    """For Popen's preexec_fn: on Linux the child gets SIGTERM (Daphne's clean shutdown) when the demo dies, however
    it dies. Without it a demo killed with -9 (or by the OOM killer) left its Daphne serving the port with no agents:
    the fleet went offline on the console, and the next `make run` could not listen. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the demo died before the signal was armed
            os._exit(1)

    return arm


def sign_in_reminder(server: str, password: str) -> str:
    return f"\nReminder: sign in at {server}/ as admin / {password}   ({DEMO_DIR.name}/admin-password)\n"


def write_private(path: Path, text: str) -> None:
    """Writes a secret readable by its owner only, from the first byte: a write then a chmod left it
    world-readable in between (and kept a wider mode an older file had)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def submit_demo_leases(server: str, stop: threading.Event) -> None:
    """A demo integration: the recovery cases below, then leases at a pace that follows the fleet and an operator's
    day now and then (slotkeeper/demo_load.py), through the real API, until `stop` is set."""
    import requests

    from slotkeeper import demo_load

    token = issue("demo-integration", "operator", "demo lease generator")
    admin = issue("demo-operator-day", "admin", "demo: a node lost and re-admitted, a node drained")
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    stop.wait(10)  # let the agents' first heartbeats land, or every node would still be stale
    with contextlib.suppress(requests.RequestException):
        _demo_recovery_cases(server, session)
    demo_load.run(server, token, admin, stop)


def _demo_recovery_cases(server: str, session) -> None:
    """Things an operator should be able to find in the demo: a crash-looping instance whose restart history fills
    up and ends failed, and an anti-affinity group whose members a node death will test. A restarted demo keeps
    the ones it made before (creating the group again was a 400 warning on every start)."""
    # Listed, not fetched by name: a first start's 404 for the group was a warning in the log of every new demo.
    listed = session.get(f"{server}/api/groups/?limit=1000", timeout=10)
    if listed.status_code == 200 and any(g["name"] == "web" for g in listed.json()["results"]):
        return
    session.post(
        f"{server}/api/groups/", json={"name": "web", "policy": "anti_affinity", "hard": True}, timeout=10
    )
    for i in range(3):
        session.post(
            f"{server}/api/leases/",
            json={
                "name": f"web-{i}",
                "type": "best_effort",
                "duration_s": 4 * 3600,
                "nodes": [{"cpu_cores": 1, "mem_mib": 2048, "disk_gib": 5}],
                "groups": ["web"],
            },
            timeout=10,
        )
    session.post(
        f"{server}/api/leases/",
        json={
            "name": "crash-loop",
            "type": "best_effort",
            "duration_s": 3600,
            "nodes": [{"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 1}],
            "spec": {"sim": {"crash_after_s": 8, "exit_code": 3}},
        },
        timeout=10,
    )
