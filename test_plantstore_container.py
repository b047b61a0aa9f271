"""Tests of the image (deploy/Containerfile) and the Kubernetes manifests
(deploy/kubernetes/), run for real with podman (runc, as .ci/run sets it up).

The image is built from this checkout on a Debian 12 base that mmdebstrap makes and
`podman import` tags (BASE), once, and reused while it exists; no registry is reached
(pip's wheels are fetched outside and mounted into the build). podman 4.3 is not
Kubernetes, so each test plays what podman can and does the rest itself:
- `podman kube play` runs a manifest's Deployment as one pod, with its
  securityContext, args, env, resources, emptyDir and PersistentVolumeClaim, and its
  liveness probe as a healthcheck, which the test runs (`podman healthcheck run`: no
  systemd here runs it on a timer);
- it has no Secret (a secret volume crashes it), so a folder of files takes its place;
  no Service, so the test routes connections itself (Router), to the pods it found
  ready by their readiness probe's path, as the kubelet would; no rolling update, so
  the test plays one pod, then stops another, in the order Kubernetes does; no preStop,
  nor terminationGracePeriodSeconds, so the test runs the one and waits the other out.
Every container, pod and volume is named under this run's prefix (RUN) and removed when
its test ends; the images stay, for the next run."""

import configparser
import contextlib
import copy
import fcntl
import http.client
import itertools
import json
import os
import random
import re
import secrets
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import plantstore
from testbed import (
    HERE,
    SECRET,
    TOKEN,
    WAIT,
    Creates,
    exchange,
    free_port,
    listed_ids,
    post_over_http,
    wait_until,
)

# The base: Debian 12's Python, its venv, and curl, with which podman runs an httpGet
# probe inside the container. An imported image has no PATH of its own.
BASE = "localhost/plantstore-base:bookworm"
BASE_PACKAGES = "python3,python3-venv,curl"
BASE_PYTHON = "3.11"  # Debian 12's: the wheels are for it, whatever runs the tests
BASE_PATH = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUILT = "plantstore.test-build"  # the label of the images these tests build
RUN = f"plantstore-test-{secrets.token_hex(3)}"  # this run's podman objects
CONTAINERFILE = HERE / "deploy" / "Containerfile"
KUBERNETES = HERE / "deploy" / "kubernetes"
DB_SETTINGS = {"PLANTSTORE_DB", "PLANTSTORE_DB_FILE"}


def run(*command, timeout=WAIT * 2):
    """Run a command; return its stdout, stripped. Fails, with its stderr, unless it
    succeeds."""
    done = subprocess.run(
        [*map(str, command)], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{' '.join(map(str, command))}: {done.stderr}"
    return done.stdout.strip()


def podman(*args, timeout=WAIT * 2):
    return run("podman", *args, timeout=timeout)


# ---- The image: a base made once, the app built from this checkout on it ----


def make_base(folder):
    """BASE, made by mmdebstrap unless it exists; one run at a time makes it."""
    with open(Path(tempfile.gettempdir()) / "plantstore-base.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["podman", "image", "exists", BASE]).returncode == 0:
            return
        tar = folder / "base.tar"
        minbase = ("mmdebstrap", "--quiet", "--variant=minbase")
        run(*minbase, f"--include={BASE_PACKAGES}", "bookworm", tar, timeout=600)
        podman("import", "--change", BASE_PATH, tar, BASE, timeout=300)
        tar.unlink()


def build_image(folder):
    """Build deploy/Containerfile on BASE, tagged plantstore; return the image's id."""
    extras = re.search(r"'/src(\[[\w,]+\])'", CONTAINERFILE.read_text())[1]
    pyproject = tomllib.loads((HERE / "pyproject.toml").read_text())
    # the build reaches no index: what pip needs, fetched here
    wheels = folder / "wheels"
    pip = (sys.executable, "-m", "pip", "download", "-q", "-d", wheels)
    pip += ("--python-version", BASE_PYTHON, "--only-binary=:all:")
    run(*pip, f"{HERE}{extras}", *pyproject["build-system"]["requires"], timeout=300)
    # this file's builds that no tag names any more, but for a run's under way
    podman(
        "image", "prune", "-f", "--filter", f"label={BUILT}", "--filter", "until=10m"
    )
    built = podman(
        *("build", "--layers=false", "--label", BUILT, "-f", CONTAINERFILE, "-t"),
        *("plantstore", "--build-arg", f"BASE={BASE}", "-v", f"{wheels}:/wheels:ro"),
        *("--build-arg", "PIP_NO_INDEX=1", "--build-arg", "PIP_FIND_LINKS=/wheels"),
        HERE,
        timeout=600,
    )
    assert "Successfully tagged localhost/plantstore:latest" in built, built
    return built.split()[-1]


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    folder = tmp_path_factory.mktemp("image")
    make_base(folder)
    return build_image(folder)


# ---- The manifests, as podman 4.3 plays them ----


def manifest(name):
    """The documents of deploy/kubernetes/NAME, by kind."""
    return {
        document["kind"]: document
        for document in yaml.safe_load_all((KUBERNETES / name).read_text())
    }


def secret_folder(folder, uid, **files):
    """A folder of files, each readable by uid alone: a Secret, as a pod mounts it."""
    folder.mkdir()
    for file_name, text in files.items():
        (folder / file_name).write_text(f"{text}\n")
        (folder / file_name).chmod(0o400)
        os.chown(folder / file_name, uid, 0)
    return folder


def as_podman_plays_it(manifest_name, name, image, secrets_folder):
    """The manifest's Deployment, named `name`, as podman 4.3 can play it: one replica,
    of the image built here, a folder in the Secret's place, and an emptyDir of its own
    (podman's is one volume for every pod that names it). Returns the Deployment, and
    its pod's spec and container, to change further."""
    deployment = copy.deepcopy(manifest(manifest_name)["Deployment"])
    deployment["metadata"]["name"] = name
    deployment["spec"]["replicas"] = 1
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    container["image"] = image
    renamed = {}
    for volume in spec["volumes"]:
        if volume.pop("secret", None):
            volume["hostPath"] = {"path": str(secrets_folder), "type": "Directory"}
        elif "emptyDir" in volume:
            renamed[volume["name"]] = volume["name"] = f"{name}-{volume['name']}"
    for mount in container["volumeMounts"]:
        mount["name"] = renamed.get(mount["name"], mount["name"])
    return deployment, spec, container


@pytest.fixture
def started(tmp_path):
    """What a test starts with podman (`run`, `play`), under RUN's prefix; all of it
    removed when the test ends."""
    objects = SimpleNamespace(running=[], runs=[], plays=[], volumes=[])

    def run(name, *args):
        objects.runs.append(f"{RUN}-{name}")
        objects.running.append(podman("run", "-d", "--name", objects.runs[-1], *args))
        return objects.running[-1]

    def play(document):
        """Play one document; return the id of its pod's container."""
        path = tmp_path / f"{document['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(document))
        if document["kind"] == "PersistentVolumeClaim":
            objects.volumes.append(document["metadata"]["name"])
        else:
            objects.plays.append(path)
        played = podman("kube", "play", path).partition("Container:")[2].strip()
        objects.running.append(played)
        return played

    yield SimpleNamespace(run=run, play=play, folder=tmp_path)

    def quietly(*args):
        subprocess.run(["podman", *map(str, args)], capture_output=True, timeout=WAIT)

    if objects.running:
        quietly("stop", "-t", "0", *objects.running)  # at once: this stop is no test
    for path in reversed(objects.plays):
        quietly("kube", "down", path)
    for name in objects.runs:
        quietly("rm", "-f", name)
    for name in objects.volumes:
        quietly("volume", "rm", "-f", name)


def logs(container):
    """What the container wrote: (stdout, stderr)."""
    done = subprocess.run(
        ["podman", "logs", container], capture_output=True, text=True, timeout=WAIT
    )
    return done.stdout, done.stderr


def wait_answering(port, container, path):
    """Until GET path answers 200 on port, as the kubelet's probe asks it; fail with the
    container's lines if it stops first."""

    def answers():
        with contextlib.suppress(OSError, http.client.HTTPException):
            return exchange("127.0.0.1", port, "GET", path)[0] == 200
        running = podman("inspect", "--format", "{{.State.Running}}", container)
        assert running == "true", f"the container stopped: {logs(container)}"
        return False

    wait_until(answers, lambda: f"{path} never answered 200: {logs(container)}")


# ---- The tests ----


def test_the_two_deployments_differ_in_where_the_plants_are_alone():
    """postgres.yaml's Deployment is sqlite.yaml's but for the store: its setting, the
    claim's volume, the Secret's files, the replicas and how they are replaced. The
    probes, the stop, the securityContext and the resources are written twice, and
    held together here; each file is played below."""

    def without_the_store(name):
        deployment = manifest(name)["Deployment"]
        del deployment["spec"]["replicas"], deployment["spec"]["strategy"]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        container["env"] = [
            env for env in container["env"] if env["name"] not in DB_SETTINGS
        ]
        claims = {v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in claims]
        mounts = container["volumeMounts"]
        container["volumeMounts"] = [m for m in mounts if m["name"] not in claims]
        for volume in pod["volumes"]:
            volume.get("secret", {}).pop("items", None)
        return deployment

    assert without_the_store("sqlite.yaml") == without_the_store("postgres.yaml")


def test_the_image_builds_from_this_checkout_with_every_module_it_lists(image):
    """Built and tagged plantstore (the fixture): it runs as a user that is not root,
    and holds this checkout's plantstore, with every module setup.cfg lists."""
    setup = configparser.ConfigParser()
    setup.read(HERE / "setup.cfg")
    modules = ", ".join(setup["options"]["py_modules"].split())
    python = "/opt/plantstore/bin/python"
    imported = podman(
        *("run", "--rm", "--name", f"{RUN}-modules", "--read-only", "--entrypoint"),
        *(python, image, "-c"),
        f"import os, {modules}; print(os.getuid(), plantstore.__version__)",
    )
    uid, version = imported.split()
    assert int(uid) != 0 and version == plantstore.__version__


def service_links(service, address, port, port_name):
    """The variables the kubelet sets in every pod for a Service of the namespace
    (enableServiceLinks, true unless a pod says otherwise)."""
    name = service.upper().replace("-", "_")
    url = f"tcp://{address}:{port}"
    return {
        f"{name}_SERVICE_HOST": address,
        f"{name}_SERVICE_PORT": port,
        f"{name}_SERVICE_PORT_{port_name.upper()}": port,
        f"{name}_PORT": url,
        f"{name}_PORT_{port}_TCP": url,
        f"{name}_PORT_{port}_TCP_PROTO": "tcp",
        f"{name}_PORT_{port}_TCP_PORT": port,
        f"{name}_PORT_{port}_TCP_ADDR": address,
    }


def test_a_read_only_container_of_any_uid_serves_with_service_links_set(image, started):
    """As the manifests run it (a read-only root, a tmpfs where their emptyDir is, the
    tokens from a file) but as a UID of no user's, and with the variables of two
    Services, `plantstore` and `plantstore-db`, which a pod gets without
    enableServiceLinks: false: it serves creates, and both probes' paths answer."""
    spec = manifest("sqlite.yaml")["Deployment"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    env = {variable["name"]: variable["value"] for variable in container["env"]}
    uid, port = random.randrange(100000, 2**31), free_port()
    secrets_folder = secret_folder(started.folder / "secrets", uid, tokens=TOKEN)
    links = {
        **service_links("plantstore", "10.0.0.11", 80, "http"),
        **service_links("plantstore-db", "10.0.0.12", 5432, "postgres"),
    }
    name = started.run(
        *("readonly", "--read-only", "--read-only-tmpfs=false", "--tmpfs"),
        *(mounts["tmp"], "--user", f"{uid}:0", "-p", f"127.0.0.1:{port}:8000"),
        *("-v", f"{secrets_folder}:{mounts['secrets']}:ro"),
        *("-e", f"PLANTSTORE_TOKENS_FILE={env['PLANTSTORE_TOKENS_FILE']}"),
        *(arg for item in links.items() for arg in ("-e", "%s=%s" % item)),
        image,
    )
    probes = {
        kind: container[f"{kind}Probe"]["httpGet"] for kind in ("liveness", "readiness")
    }
    wait_answering(port, name, probes["readiness"]["path"])
    for plant_id in 1, 2, 3:
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http("127.0.0.1", port, TOKEN, document)[0] == 200
    assert listed_ids("127.0.0.1", port) == [1, 2, 3]
    for probe in probes.values():
        assert probe["port"] == 8000
        assert exchange("127.0.0.1", port, "GET", probe["path"])[::2] == (
            200,
            {"status": "ok"},
        )
    stdout, stderr = logs(name)
    assert "plantstore: version" in stderr and TOKEN not in stdout + stderr


def test_kube_play_of_the_sqlite_manifest_keeps_its_plants_across_a_pod_replaced(
    image, started
):
    """sqlite.yaml's claim and Deployment, played: the pod serves on its port, its
    liveness probe passes, and the plants it took are served by the pod that replaces
    it, from the claim's volume."""
    claim = manifest("sqlite.yaml")["PersistentVolumeClaim"]
    claim["metadata"]["name"] = f"{RUN}-data"
    secrets_folder = secret_folder(started.folder / "secrets", 10001, tokens=TOKEN)
    deployment, spec, container = as_podman_plays_it(
        "sqlite.yaml", f"{RUN}-sqlite", image, secrets_folder
    )
    for volume in spec["volumes"]:
        if "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = claim["metadata"]["name"]
    port = free_port()
    container["ports"][0].update(hostPort=port, hostIP="127.0.0.1")
    ready = container["readinessProbe"]["httpGet"]["path"]
    started.play(claim)
    first = started.play(deployment)
    wait_answering(port, first, ready)
    podman("healthcheck", "run", first)  # the liveness probe, by curl in the container
    assert podman("inspect", "--format", "{{.State.Health.Status}}", first) == "healthy"
    for plant_id in range(1, 6):
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http("127.0.0.1", port, TOKEN, document)[0] == 200
    podman("kube", "down", started.folder / f"{RUN}-sqlite.yaml")
    second = started.play(deployment)
    assert second != first
    wait_answering(port, second, ready)
    assert listed_ids("127.0.0.1", port) == [1, 2, 3, 4, 5]


class Router:
    """The Service, as kube-proxy makes it: each new connection goes to one of the
    ready pods, in turn; a pod taken out gets no new connection, and those it has go
    on. A connection its pod refuses is reset, as the pod's own refusal would be."""

    def __init__(self):
        self.ready, self.turns = [], itertools.count()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        with contextlib.suppress(OSError):  # closed
            while True:
                client = self.listener.accept()[0]
                threading.Thread(
                    target=self._carry, args=(client,), daemon=True
                ).start()

    def _carry(self, client):
        ready = list(self.ready)
        try:
            pod = socket.create_connection(
                ("127.0.0.1", ready[next(self.turns) % len(ready)]), timeout=WAIT
            )
        except OSError:
            linger = struct.pack("ii", 1, 0)  # on, 0 s: close() sends a reset
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            client.close()
            return
        client.settimeout(WAIT)
        back = threading.Thread(target=_carry_one_way, args=(pod, client))
        back.start()
        _carry_one_way(client, pod)
        back.join()
        client.close()
        pod.close()

    def close(self):
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.listener.close()


def _carry_one_way(source, sink):
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)


def play_postgres_pod(started, image, secrets_folder, letter):
    """postgres.yaml's pod, played on the host's network (PostgreSQL listens on its
    loopback) on a port of its own; return (port, container)."""
    deployment, spec, container = as_podman_plays_it(
        "postgres.yaml", f"{RUN}-postgres-{letter}", image, secrets_folder
    )
    spec["hostNetwork"] = True
    del container["ports"]  # no mapping on the host's network
    port, args = free_port(), container["args"]
    args[args.index("-b") + 1] = f"127.0.0.1:{port}"
    return port, started.play(deployment)


def test_postgres_pods_replaced_one_at_a_time_lose_no_create(image, started, pg_url):
    """Two pods of postgres.yaml behind the Service (Router), and a third one ready
    before the first is told to stop, as a rolling update goes: its preStop runs, the
    Service drops it a moment later, then it gets SIGTERM. Every create answered 200 is
    listed, and no client met an error."""
    deployment = manifest("postgres.yaml")["Deployment"]
    service = manifest("service.yaml")["Service"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    ready = container["readinessProbe"]["httpGet"]["path"]
    secrets_folder = secret_folder(
        started.folder / "secrets", 10001, tokens=TOKEN, db=pg_url
    )
    router, creates = Router(), None
    try:
        pods = [play_postgres_pod(started, image, secrets_folder, n) for n in "ab"]
        for port, pod in pods:
            wait_answering(port, pod, ready)
        router.ready = [port for port, _ in pods]
        creates = Creates("127.0.0.1", router.port)
        creates.wait_for(50)
        port, pod = play_postgres_pod(started, image, secrets_folder, "c")
        wait_answering(port, pod, ready)
        router.ready = [*router.ready, port]
        (old_port, old), grace = pods[0], spec["terminationGracePeriodSeconds"]

        def kubelet_stops_it():  # the preStop, then SIGTERM, and the grace period
            podman("exec", old, *container["lifecycle"]["preStop"]["exec"]["command"])
            podman("stop", "-t", grace, old, timeout=grace + WAIT)

        stopping = threading.Thread(target=kubelet_stops_it)
        stopping.start()
        time.sleep(1)  # the endpoints' news reaches kube-proxy a moment after
        router.ready = [port for port in router.ready if port != old_port]
        stopping.join()
        creates.wait_for(len(creates.answered) + 50)
    finally:
        answered = creates and creates.stop()
        router.close()
    assert set(creates.statuses) == {200}, creates.statuses
    assert podman("inspect", "--format", "{{.State.ExitCode}}", old) == "0"
    assert answered <= set(listed_ids("127.0.0.1", pods[1][0]))


def test_sigterm_delivers_the_webhook_events_waiting_in_memory_within_the_grace(
    image, started, receiver
):
    """The image's own recipe (the in-memory store), with webhooks to a receiver that
    holds every delivery: 20 events wait at SIGTERM. Each reaches the receiver, and the
    server exits 0, within the manifests' grace period."""
    hook = receiver()
    hook.hold = threading.Event()
    secrets_folder = secret_folder(
        started.folder / "secrets", 10001, tokens=TOKEN, webhook=SECRET
    )
    cmd = podman("image", "inspect", "--format", "{{json .Config.Cmd}}", image)
    port, command = free_port(), json.loads(cmd)
    command[command.index("-b") + 1] = f"127.0.0.1:{port}"  # on the host's network
    name = started.run(
        *("sigterm", "--network", "host", "--read-only", "--read-only-tmpfs=false"),
        *("--tmpfs", "/tmp", "-v", f"{secrets_folder}:/run/secrets/plantstore:ro"),
        *("-e", "PLANTSTORE_TOKENS_FILE=/run/secrets/plantstore/tokens"),
        *("-e", "PLANTSTORE_WEBHOOK_SECRET_FILE=/run/secrets/plantstore/webhook"),
        *("-e", f"PLANTSTORE_WEBHOOK_URL={hook.url}", image, *command),
    )
    wait_answering(port, name, "/livez")
    for plant_id in range(20):
        document = {"id": plant_id, "name": f"plant {plant_id}"}
        assert post_over_http("127.0.0.1", port, TOKEN, document)[0] == 200
    assert hook.delivered() == []  # they wait: the receiver holds every attempt
    pod = manifest("postgres.yaml")["Deployment"]["spec"]["template"]["spec"]
    grace = pod["terminationGracePeriodSeconds"]
    podman("kill", "--signal", "TERM", name)
    hook.hold.set()
    assert podman("wait", name, timeout=grace) == "0"
    delivered = sorted(payload["id"] for payload in hook.delivered())
    assert delivered == list(range(20)), f"{len(delivered)} of 20: {logs(name)[1]}"
