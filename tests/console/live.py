"""A real console for the browser tests: Daphne (HTTP + websocket, the embedded loop on) in a subprocess, against
its own SQLite file, with three nodes, an operator who signs in with a password, and API tokens.

Django's live_server is a WSGI thread and cannot serve /ws/console/, and the live updates are what these tests are
for, so the console runs exactly as `make run` runs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from slotkeeper.shutdown import DAPHNE_TIMEOUTS

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "console-test-password"

SETUP = """
import json
from django.contrib.auth import get_user_model
from django.utils import timezone
from fleet import actions
from slotkeeper.management.commands.issue_token import issue

out = {"nodes": {}}
for name, caps in [("tank", ["gpu"]), ("architect", []), ("morpheus", [])]:
    node, token = actions.do_register_node(
        None, name=name, cpu_cores=8, mem_total_mib=16384, disk_total_gib=200, capabilities=caps, now=timezone.now()
    )
    out["nodes"][name] = {"id": node.pk, "token": token}
out["operator_token"] = issue("otto", "operator")
user = get_user_model().objects.get(username="otto")
user.set_password(%r)
user.save(update_fields=["password"])
print("SETUP" + json.dumps(out))
"""


@dataclass
class Console:
    url: str
    nodes: dict
    operator_token: str
    process: subprocess.Popen

    def api(self, method: str, path: str, token: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def heartbeat(self, name: str, *, used_mib: int) -> dict:
        node = self.nodes[name]
        report = {"mem_total_mib": 16384, "mem_used_mib": used_mib, "disk_free_gib": 150.0, "cpu_pct": 4.0,
                  "load1": 0.2, "instances": []}  # fmt: skip
        return self.api("POST", f"/api/nodes/{node['id']}/heartbeat", node["token"], report)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(db_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(
        DATABASE_URL=f"sqlite:///{db_path}",
        SECRET_KEY="browser-tests-only",
        EMBEDDED_LOOP="1",
        # Nodes heartbeat only when a test says so: keep them online and placeable for the whole run.
        SLOTKEEPER_OFFLINE_AFTER_S="900",
        SLOTKEEPER_HEALTH_MAX_AGE_S="900",
        PYTHONUNBUFFERED="1",
    )
    return env


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("daphne did not answer /healthz in time")


def migrated(manage: list[str]) -> Path:
    """An empty database with every migration applied, made once per set of migrations and copied for each
    console: migrating took 15-19 s of every browser module's setup on the two-core machine, about a third of
    `make test`'s time. Written under a name of its own and renamed, so two xdist workers never read half of one."""
    files = sorted(ROOT.glob("*/migrations/*.py"))
    digest = hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files)).hexdigest()[:16]
    template = Path(tempfile.gettempdir()) / f"slotkeeper-console-{digest}.sqlite3"
    if not template.exists():
        partial = template.with_name(f"{template.stem}.{os.getpid()}.tmp.sqlite3")
        env = environment(partial)
        subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
        # The last connection's close checkpoints SQLite's write-ahead log into the file; check, not assume.
        assert not Path(f"{partial}-wal").exists(), "the migrated database left a write-ahead log behind"
        os.replace(partial, template)
    return template


def seeded(manage: list[str]) -> tuple[Path, dict]:
    """The migrated database with SETUP's nodes, operator and tokens in it, and what SETUP printed: made once per
    test run (xdist's run id; the process outside xdist) and copied for each console, where every console ran SETUP
    in a `manage.py shell` of its own (a Django start, 2-5 s of a module's setup). Per run, not kept across runs
    like `migrated`: the nodes' registration and the audit rows are as fresh as the run. Both files are made in a
    directory of their own and the directory renamed into place, so a worker never pairs one's tokens with
    another's database; a worker that loses the race uses the winner's."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"pid{os.getpid()}")
    digest = hashlib.sha256((migrated(manage).name + SETUP + PASSWORD).encode()).hexdigest()[:16]
    home = Path(tempfile.gettempdir()) / f"slotkeeper-seeded-{digest}-{run}"
    if not home.exists():
        for old in home.parent.glob("slotkeeper-seeded-*"):  # earlier runs': a day is long past any run
            if time.time() - old.stat().st_mtime > 86400:
                shutil.rmtree(old, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=f"{home.name}.", dir=home.parent))
        shutil.copyfile(migrated(manage), partial / "console.sqlite3")
        setup = subprocess.run(
            [*manage, "shell", "-c", SETUP % PASSWORD],
            env=environment(partial / "console.sqlite3"),
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        assert not (partial / "console.sqlite3-wal").exists(), (
            "the seeded database left a write-ahead log behind"
        )
        line = next(line for line in setup.stdout.splitlines() if line.startswith("SETUP"))
        (partial / "setup.json").write_text(line[5:])
        try:
            partial.rename(home)
        except OSError:  # another worker's is in place: ours goes
            shutil.rmtree(partial, ignore_errors=True)
    return home / "console.sqlite3", json.loads((home / "setup.json").read_text())


def start(workdir: Path) -> Console:
    env = environment(workdir / "console.sqlite3")
    template, data = seeded([sys.executable, str(ROOT / "manage.py")])
    shutil.copyfile(template, workdir / "console.sqlite3")
    port = free_port()
    with open(workdir / "daphne.log", "w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                *DAPHNE_TIMEOUTS,
                "slotkeeper.asgi:application",
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
    except RuntimeError:
        stop(process)
        raise
    return Console(url=url, nodes=data["nodes"], operator_token=data["operator_token"], process=process)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()


# Debian's Chromium (Playwright's own browser download does not work here), with the flags that keep it off the
# network: without them it tries to reach update and sync services at every start.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# The marks every browser-test module carries: skipped, with the reason, only where Chromium is not installed.
BROWSER_TEST = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
]


@contextmanager
def running(tmp: Path, used_mib: int = 2048) -> Iterator[Console]:
    """A live console whose nodes have all heartbeated once (`used_mib` each), stopped on exit: what every browser
    test module's `console` fixture starts from."""
    server = start(tmp)
    try:
        for name in server.nodes:
            server.heartbeat(name, used_mib=used_mib)
        yield server
    finally:
        stop(server.process)


def shell(workdir: Path, code: str) -> None:
    """Runs Python in `manage.py shell` against the console started in `workdir` (set-up a test cannot do
    through the API, such as creating an admin with a password)."""
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        env=environment(workdir / "console.sqlite3"),
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


# --- browser helpers shared by the Chromium tests ------------------------------------------------------------

ARTIFACTS = ROOT / "test-artifacts"  # screenshots of failed browser tests


def sign_in(browser, console, username: str = "otto", password: str = PASSWORD, **options):
    """A signed-in browser context; `options` go to `new_context` (a time zone, a colour scheme)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **options)
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.goto(console.url + "/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(console.url + "/")
    page.close()
    return context


def new_page(context, request):
    page = context.new_page()
    request.addfinalizer(lambda: screenshot_on_failure(page, request))
    return page


def screenshot_on_failure(page, request) -> None:
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    page.close()
