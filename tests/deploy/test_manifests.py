"""The deployment kit stays true to the code it deploys.

Every manifest loads; the Kubernetes objects are well formed and wired to each other; every command in the
Dockerfile, the compose file, the manifests and the systemd units names a module, Celery app, management
command or console script that exists in this repository; every environment variable they set is one that
slotkeeper/settings.py reads. Renaming a module, a setting, a route or an agent flag without updating deploy/
fails here, not at three in the morning on the first rollout. No database, no Docker.
"""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import django
import pytest
import yaml

from slotkeeper.shutdown import DAPHNE_TIMEOUTS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"
NGINX_CONF = DEPLOY / "nginx.conf"

YAML_FILES = sorted(DEPLOY.rglob("*.yml")) + sorted(DEPLOY.rglob("*.yaml"))
K8S_FILES = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
UNIT_FILES = sorted(SYSTEMD.glob("*.service"))
NAMESPACE = "slotkeeper"
# Read by the interpreter, by Celery or by prometheus-client, not by settings.py: PYTHONPATH makes BASE_DIR the
# source tree, REMAP_SIGTERM makes a worker's SIGTERM the bounded soft shutdown, and PROMETHEUS_MULTIPROC_DIR is
# where a process keeps its metrics (read at import by slotkeeper/metrics.py, before settings).
INTERPRETER_ENV = {"PYTHONPATH", "REMAP_SIGTERM", "PROMETHEUS_MULTIPROC_DIR"}


# --- readers -------------------------------------------------------------------------------------------


@cache
def load_yaml_documents(path: Path) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None)


def k8s_objects() -> list[dict[str, Any]]:
    return [doc for path in K8S_FILES for doc in load_yaml_documents(path)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} named {name}, found {len(matches)}"
    return matches[0]


def workloads() -> list[dict[str, Any]]:
    return [o for o in k8s_objects() if o["kind"] in {"Deployment", "Job"}]


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def compose() -> dict[str, Any]:
    return load_yaml_documents(COMPOSE)[0]


def app_services() -> dict[str, dict[str, Any]]:
    """The compose services that run the Slotkeeper image (the ones built from deploy/Dockerfile)."""
    return {name: svc for name, svc in compose()["services"].items() if "build" in svc}


def dockerfile_instructions() -> list[tuple[str, str]]:
    joined = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def dockerfile_args(instruction: str) -> list[str]:
    return [args for name, args in dockerfile_instructions() if name == instruction]


def dockerfile_cmd() -> list[str]:
    (cmd,) = dockerfile_args("CMD")
    return yaml.safe_load(cmd)  # the exec form is a JSON list, and JSON is YAML


def unit_directives(path: Path) -> list[tuple[str, str]]:
    joined = path.read_text().replace("\\\n", " ")
    pairs = [line.split("=", 1) for line in joined.splitlines() if "=" in line and not line.startswith("#")]
    return [(key.strip(), value.strip()) for key, value in pairs]


def unit_directive(path: Path, key: str) -> str:
    (value,) = [v for k, v in unit_directives(path) if k == key]
    return value


def env_file_keys(path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line.split("=", 1)[0] for line in lines if line and not line.startswith("#")]


def compose_interpolations() -> set[str]:
    return set(re.findall(r"\$\{(\w+)", COMPOSE.read_text()))


def env_lookup(node: ast.AST) -> str | None:
    """The variable name when `node` reads the environment: os.environ.get, os.getenv, os.environ[...] or one
    of the env_* helpers settings.py defines."""
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = ast.unparse(node.func)
        if func.endswith(("environ.get", "getenv", "environ.setdefault")) or func.startswith("env_"):
            return str(node.args[0].value)
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value) if ast.unparse(node.value).endswith("environ") else None
    return None


@cache
def settings_env_reads() -> frozenset[str]:
    tree = ast.parse((ROOT / "slotkeeper" / "settings.py").read_text())
    return frozenset(name for node in ast.walk(tree) if (name := env_lookup(node)) is not None)


def routed_paths() -> set[str]:
    """The literal routes in slotkeeper/urls.py, as absolute paths."""
    tree = ast.parse((ROOT / "slotkeeper" / "urls.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "path"]
    return {"/" + str(c.args[0].value) for c in calls if c.args and isinstance(c.args[0], ast.Constant)}


# --- what a command refers to --------------------------------------------------------------------------


def top_level_names(module: str) -> set[str] | None:
    """Names a module binds at top level, or None when its file does not exist in this repository."""
    path = ROOT / (module.replace(".", "/") + ".py")
    if not path.is_file():
        return None
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def problem_with_reference(module: str, attribute: str) -> str | None:
    names = top_level_names(module)
    if names is None:
        return f"module {module} has no file in the repository"
    if attribute not in names:
        return f"{module} does not define {attribute}"
    return None


def console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def management_commands() -> set[str]:
    roots = [Path(django.__file__).parent, ROOT]
    found = {p.stem for root in roots for p in root.glob("**/management/commands/*.py")}
    return found - {"__init__"}


def option_value(argv: list[str], *flags: str) -> str:
    indexes = [i for i, arg in enumerate(argv) if arg in flags]
    assert indexes, f"{shlex.join(argv)} has none of {flags}"
    return argv[indexes[0] + 1]


def problem_with_command(argv: list[str]) -> str | None:
    program = Path(argv[0]).name
    if program == "daphne":
        module, _, attribute = argv[-1].partition(":")
        return problem_with_reference(module, attribute)
    if program == "celery":
        # `-A slotkeeper` makes Celery import slotkeeper.celery and use its `app`.
        return problem_with_reference(option_value(argv, "-A", "--app") + ".celery", "app")
    if program in {"python", "python3"} and argv[1] == "manage.py":
        if not (ROOT / "manage.py").is_file():
            return "manage.py is missing from the repository root"
        return None if argv[2] in management_commands() else f"no management command {argv[2]}"
    if program in console_scripts():
        module, _, attribute = console_scripts()[program].partition(":")
        return problem_with_reference(module, attribute)
    return f"{program} is not a program this repository provides"


def commands_in(source: Path) -> list[list[str]]:
    if source == DOCKERFILE:
        return [dockerfile_cmd()]
    if source == COMPOSE:
        return [svc["command"] for svc in app_services().values() if "command" in svc]
    if source.parent == SYSTEMD:
        return [shlex.split(unit_directive(source, "ExecStart"))]
    # A container without command or args runs the image's CMD.
    return [
        c.get("command", []) + c.get("args", []) or dockerfile_cmd()
        for w in load_yaml_documents(source)
        for c in containers(w)
    ]


COMMAND_SOURCES = [DOCKERFILE, COMPOSE, *UNIT_FILES] + [
    p for p in K8S_FILES if any(d["kind"] in {"Deployment", "Job"} for d in load_yaml_documents(p))
]


# --- every file loads ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_loads(path):
    assert load_yaml_documents(path), f"{path} holds no document"


def test_the_kustomization_applies_every_manifest():
    (kustomization,) = load_yaml_documents(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in K8S_FILES)


# --- Kubernetes objects --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", K8S_FILES, ids=lambda p: p.name)
def test_every_kubernetes_object_has_its_identity(path):
    for obj in load_yaml_documents(path):
        assert obj["apiVersion"] and obj["kind"] and obj["metadata"]["name"]
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize("kind", ["Namespace", "ConfigMap", "Secret", "Service", "Ingress", "Job"])
def test_the_manifests_define_each_kind_of_object(kind):
    assert any(o["kind"] == kind for o in k8s_objects())


@pytest.mark.parametrize("name", ["slotkeeper-web", "slotkeeper-worker", "slotkeeper-beat"])
def test_each_process_has_its_deployment(name):
    assert k8s_object("Deployment", name)


def test_every_workload_selector_matches_its_pod_labels():
    for workload in (o for o in k8s_objects() if o["kind"] == "Deployment"):
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]


def test_the_selectors_of_different_deployments_do_not_overlap():
    # Overlapping selectors make one Deployment adopt (and scale away) the other's pods.
    selectors = [
        tuple(sorted(o["spec"]["selector"]["matchLabels"].items()))
        for o in k8s_objects()
        if o["kind"] == "Deployment"
    ]
    assert len(set(selectors)) == len(selectors)


def web_container() -> dict[str, Any]:
    (container,) = containers(k8s_object("Deployment", "slotkeeper-web"))
    return container


def web_port(name_or_number: str | int) -> int:
    if isinstance(name_or_number, int):
        return name_or_number
    (port,) = [p["containerPort"] for p in web_container()["ports"] if p.get("name") == name_or_number]
    return port


def test_the_service_selects_the_web_pods_on_the_port_daphne_binds():
    service = k8s_object("Service", "slotkeeper-web")
    pod_labels = k8s_object("Deployment", "slotkeeper-web")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert web_port(port["targetPort"]) == int(option_value(dockerfile_cmd(), "-p", "--port"))


def test_the_ingress_routes_to_the_web_service_port():
    ingress = k8s_object("Ingress", "slotkeeper")
    service = k8s_object("Service", "slotkeeper-web")
    backends = [p["backend"]["service"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for backend in backends:
        assert backend["name"] == service["metadata"]["name"]
        assert backend["port"]["name"] in service_ports


@pytest.mark.parametrize("annotation", ["proxy-read-timeout", "proxy-send-timeout"])
def test_the_ingress_keeps_an_idle_console_websocket_open(annotation):
    # ingress-nginx drops a proxied connection after 60 s of silence: the console would resync every minute.
    annotations = k8s_object("Ingress", "slotkeeper")["metadata"]["annotations"]
    assert int(annotations[f"nginx.ingress.kubernetes.io/{annotation}"]) >= 3600


@pytest.mark.parametrize(
    ("probe", "path"),
    [("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")],
)
def test_the_web_probes_ask_the_right_endpoint_on_the_daphne_port(probe, path):
    get = web_container()[probe]["httpGet"]
    assert get["path"] == path
    assert web_port(get["port"]) == int(option_value(dockerfile_cmd(), "-p", "--port"))


@pytest.mark.parametrize("probe", ["startupProbe", "livenessProbe", "readinessProbe"])
def test_the_web_probes_present_a_host_django_accepts(probe):
    # The kubelet's default Host is the pod IP, which Django answers with 400: the pod would never be ready.
    headers = {h["name"]: h["value"] for h in web_container()[probe]["httpGet"].get("httpHeaders", [])}
    allowed = k8s_object("ConfigMap", "slotkeeper-config")["data"]["ALLOWED_HOSTS"].split(",")
    assert headers.get("Host") in [host.strip() for host in allowed]


def probed_paths() -> set[str]:
    k8s = {web_container()[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    (healthcheck,) = dockerfile_args("HEALTHCHECK")
    return k8s | set(re.findall(r"127\.0\.0\.1:\d+(/\w+)", healthcheck))


def test_every_probed_path_is_routed_by_the_project():
    assert probed_paths() <= routed_paths()


def test_exactly_one_beat_and_never_two_during_a_rollout():
    beat = k8s_object("Deployment", "slotkeeper-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: w["metadata"]["name"])
def test_every_pod_runs_as_the_non_root_user_of_the_image(workload):
    pod_security = workload["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == image_uid()
    for container in containers(workload):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: w["metadata"]["name"])
def test_every_container_declares_requests_and_limits(workload):
    for container in containers(workload):
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= container["resources"][bound].keys(), (container["name"], bound)


@pytest.mark.parametrize("workload", workloads(), ids=lambda w: w["metadata"]["name"])
def test_every_container_reads_the_config_map_and_the_secret(workload):
    defined = {(o["kind"], o["metadata"]["name"]) for o in k8s_objects()}
    for container in containers(workload):
        refs = {("ConfigMap", r["configMapRef"]["name"]) for r in container["envFrom"] if "configMapRef" in r}
        refs |= {("Secret", r["secretRef"]["name"]) for r in container["envFrom"] if "secretRef" in r}
        assert {kind for kind, _ in refs} == {"ConfigMap", "Secret"}
        assert refs <= defined


def test_the_beat_schedule_file_lands_on_a_writable_volume():
    # The root filesystem is read-only; beat dies at start if it cannot write its schedule.
    (beat,) = containers(k8s_object("Deployment", "slotkeeper-beat"))
    schedule = option_value(beat["command"], "--schedule", "-s")
    assert beat["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(schedule.startswith(m["mountPath"] + "/") for m in beat["volumeMounts"])


@pytest.mark.parametrize("key", ["SECRET_KEY", "DATABASE_URL"])
def test_the_committed_secret_holds_only_placeholders(key):
    assert "CHANGE-ME" in k8s_object("Secret", "slotkeeper-secrets")["stringData"][key]


# --- commands name things that exist -------------------------------------------------------------------


@pytest.mark.parametrize("source", COMMAND_SOURCES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_command_names_something_this_repository_provides(source):
    commands = commands_in(source)
    assert commands, f"{source} runs nothing"
    problems = [f"{shlex.join(argv)}: {problem_with_command(argv)}" for argv in commands]
    assert [p for p in problems if not p.endswith(": None")] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["daphne", "-p", "8000", "slotkeeper.asgi:app"],
        ["daphne", "-p", "8000", "slotkeeper.wsgi:application"],
        ["celery", "-A", "slotkeeper_old", "worker"],
        ["python", "manage.py", "no_such_command"],
        ["gunicorn", "slotkeeper.asgi:application"],
    ],
)
def test_the_command_check_rejects_a_renamed_target(argv):
    assert problem_with_command(argv) is not None


# --- a stop is bounded --------------------------------------------------------------------------------


def daphne_commands() -> list[list[str]]:
    found = [
        argv for source in COMMAND_SOURCES for argv in commands_in(source) if Path(argv[0]).name == "daphne"
    ]
    assert len(found) >= 2, "expected the image's CMD and the systemd web unit to run daphne"
    return found


def runs_with(argv: list[str], flags: tuple[str, ...]) -> bool:
    return any(tuple(argv[i : i + len(flags)]) == flags for i in range(len(argv)))


def test_every_daphne_of_the_kit_runs_with_the_projects_timeouts():
    # Without them a closed connection's application lingers 10 s, past the 10 s a stop may take.
    assert [argv for argv in daphne_commands() if not runs_with(argv, DAPHNE_TIMEOUTS)] == []


def test_a_worker_sigterm_is_the_bounded_soft_shutdown_everywhere():
    # The image (compose, Kubernetes) and the systemd unit both remap it; a warm shutdown waits without bound.
    image_env = " ".join(dockerfile_args("ENV")).split()
    assert "REMAP_SIGTERM=SIGQUIT" in image_env
    unit = SYSTEMD / "slotkeeper-worker.service"
    assert "REMAP_SIGTERM=SIGQUIT" in [v for k, v in unit_directives(unit) if k == "Environment"]
    # The pool children are stopped by the main process after the soft shutdown, not by systemd before it.
    assert unit_directive(unit, "KillMode") == "mixed"


@pytest.mark.parametrize("run", ["systemd", "kubernetes", "compose"])
def test_a_workers_grace_period_covers_its_soft_shutdown(run):
    from django.conf import settings

    grace = {
        "systemd": lambda: unit_directive(SYSTEMD / "slotkeeper-worker.service", "TimeoutStopSec"),
        "kubernetes": lambda: k8s_object("Deployment", "slotkeeper-worker")["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ],
        "compose": lambda: app_services()["worker"]["stop_grace_period"],
    }[run]()
    seconds = float(str(grace).removesuffix("s"))
    assert settings.CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT + 5 <= seconds <= 30


@pytest.mark.parametrize(
    ("service", "role"), [("worker", "worker"), ("beat", "beat"), ("migrate", "migrate")]
)
def test_compose_runs_every_role(service, role):
    assert role in app_services()[service]["command"]


def beat_schedule_tasks() -> list[str]:
    tree = ast.parse((ROOT / "slotkeeper" / "settings.py").read_text())
    (schedule,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "CELERY_BEAT_SCHEDULE"
    ]
    # Each entry's "task" (the rest of an entry may name settings, which literal_eval cannot read).
    return [
        ast.literal_eval(value)
        for entry in schedule.values
        for key, value in zip(entry.keys, entry.values, strict=True)
        if ast.literal_eval(key) == "task"
    ]


def test_beat_sends_only_tasks_that_exist():
    # A worker drops a task it has no function for ("unregistered task"), so a renamed task would silently
    # stop every tick while beat kept logging that it sent them.
    problems = [problem_with_reference(*task.rsplit(".", 1)) for task in beat_schedule_tasks()]
    assert beat_schedule_tasks()
    assert [p for p in problems if p is not None] == []


def test_the_agent_unit_passes_only_flags_the_agent_accepts():
    unit = SYSTEMD / "slotkeeper-agent.service"
    argv = shlex.split(unit_directive(unit, "ExecStart"))
    module = console_scripts()[Path(argv[0]).name].partition(":")[0]
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    for flag in (arg for arg in argv if arg.startswith("--")):
        assert f'"{flag}"' in source, f"{module} has no {flag} option"


def test_an_agent_restart_leaves_the_instances_running():
    # Instances share the unit's cgroup; the default KillMode would kill them all on every agent restart.
    assert unit_directive(SYSTEMD / "slotkeeper-agent.service", "KillMode") == "process"


# --- environment variables -----------------------------------------------------------------------------


def manifest_env_names() -> list[tuple[str, str]]:
    named = [("configmap", k) for o in k8s_objects() if o["kind"] == "ConfigMap" for k in o["data"]]
    named += [("secret", k) for o in k8s_objects() if o["kind"] == "Secret" for k in o.get("stringData", {})]
    named += [("secret", k) for o in k8s_objects() if o["kind"] == "Secret" for k in o.get("data", {})]
    for workload in workloads():
        named += [
            (workload["metadata"]["name"], e["name"]) for c in containers(workload) for e in c.get("env", [])
        ]
    named += [(f"compose {n}", k) for n, svc in app_services().items() for k in svc.get("environment", {})]
    named += [(".env.example", k) for k in env_file_keys(ENV_EXAMPLE) if k not in compose_interpolations()]
    for unit in UNIT_FILES:
        assignments = [v for k, v in unit_directives(unit) if k == "Environment"]
        named += [(unit.name, a.split("=", 1)[0]) for a in assignments]
    return named


def test_every_environment_variable_the_kit_sets_is_read_by_settings():
    unread = [(where, name) for where, name in manifest_env_names() if name not in settings_env_reads()]
    assert [(w, n) for w, n in unread if n not in INTERPRETER_ENV] == []


def test_every_compose_interpolation_is_defined_in_the_env_example():
    assert compose_interpolations() <= set(env_file_keys(ENV_EXAMPLE))


def k8s_env() -> dict[str, str]:
    config = k8s_object("ConfigMap", "slotkeeper-config")["data"]
    return {**config, **k8s_object("Secret", "slotkeeper-secrets")["stringData"]}


def compose_env(service: str) -> dict[str, str]:
    return {**dict.fromkeys(env_file_keys(ENV_EXAMPLE), ""), **app_services()[service]["environment"]}


DISTRIBUTED_KEYS = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS"}


@pytest.mark.parametrize("run", ["kubernetes", "compose web", "compose worker", "compose beat"])
def test_every_distributed_run_sets_the_shared_services_and_turns_the_embedded_loop_off(run):
    env = k8s_env() if run == "kubernetes" else compose_env(run.split()[1])
    assert env.keys() >= DISTRIBUTED_KEYS
    # With the loop on, every Daphne replica would also run each tick that beat sends.
    assert env["EMBEDDED_LOOP"] == "0"


# --- compose -------------------------------------------------------------------------------------------


def test_postgres_is_16_and_reports_its_health():
    postgres = compose()["services"]["postgres"]
    assert postgres["image"].startswith("postgres:16")
    assert "pg_isready" in postgres["healthcheck"]["test"]


def test_migrate_waits_for_a_healthy_postgres():
    assert app_services()["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


@pytest.mark.parametrize("service", ["web", "worker", "beat"])
def test_the_long_running_processes_start_after_migrations(service):
    depends = app_services()[service]["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert depends["redis"]["condition"] == "service_healthy"


def test_compose_never_runs_two_beats():
    assert compose()["services"]["beat"].get("deploy", {}).get("replicas", 1) == 1


def test_the_compose_proxy_passes_the_websocket_upgrade_on_the_console_path():
    asgi = (ROOT / "slotkeeper" / "asgi.py").read_text()
    assert 'path("ws/console/"' in asgi
    conf = NGINX_CONF.read_text()
    (block,) = re.findall(r"location /ws/ \{(.*?)\n    \}", conf, re.S)
    assert "proxy_set_header Upgrade $http_upgrade;" in block
    assert "proxy_set_header Connection $connection_upgrade;" in block


# --- the image -----------------------------------------------------------------------------------------


def image_uid() -> int:
    user = dockerfile_args("USER")[-1]
    return int(user.split(":")[0])


def test_the_image_runs_as_a_numeric_non_root_user():
    # Kubernetes cannot check runAsNonRoot against a user given by name, and refuses to start the pod.
    assert image_uid() > 0


def test_the_image_exposes_the_port_the_web_command_binds():
    assert dockerfile_args("EXPOSE") == [option_value(dockerfile_cmd(), "-p", "--port")]


def test_the_image_collects_static_files_at_build_time():
    assert any("manage.py collectstatic --noinput" in run for run in dockerfile_args("RUN"))


def test_the_build_time_secret_key_never_reaches_a_running_container():
    assert not any("SECRET_KEY" in env for env in dockerfile_args("ENV"))


@pytest.mark.parametrize("pattern", [".secret_key", "*.sqlite3", ".venv", ".git"])
def test_the_build_context_leaves_out_local_secrets_and_state(pattern):
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert pattern in ignored
