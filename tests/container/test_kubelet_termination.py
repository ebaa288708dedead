"""The Kubernetes pod spec (deploy/k8s/cpu, rendered) run on the real CPU image the way kubelet
would run and stop it: its securityContext, emptyDirs and env as `docker run` flags, its probes
(httpGet, exec) through `docker exec`, and on termination kubelet's order: the preStop hook, then SIGTERM,
then SIGKILL when terminationGracePeriodSeconds (counted from the start of the preStop) run out.

Clients keep starting streams until the preStop returns (traffic still arrives while endpoints
are being removed), so streams are in flight through the preStop and at SIGTERM, however long the
`docker exec` of the hook takes on a busy machine. Every stream must finish with [DONE], and the
container must exit 0 before the SIGKILL would be due.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import threading
import time

import pytest
import requests

from tests.deploy.manifests import container, pod_spec, prestop_seconds
from tests.harness import DOCKER, StreamResult, docker, free_port, stream_completion

pytestmark = [pytest.mark.docker, pytest.mark.slow]

OVERLAY = "cpu"
CLIENTS = 4
# Each stream lasts ~3 s on 2 idle cores, ~15 s on busy ones: longer than the settle below, and
# short enough to finish well inside the 30 s drain.
STREAM_TOKENS = 4000
# Between the last new request and SIGTERM: lets a request sent just before the clients stopped
# reach vLLM before the drain starts (after SIGTERM new requests get 503, by design).
SETTLE_S = 1.0


class Traffic:
    """CLIENTS clients, each sending one stream after another until stop()."""

    def __init__(self, url: str, model: str, timeout: float):
        self._stop = threading.Event()
        self.results: list[StreamResult] = []
        self._lock = threading.Lock()
        self.flowing = threading.Event()  # some stream produced a token (client side)
        self.last_flowing = threading.Event()  # the one_more() stream did
        self._threads = [
            threading.Thread(target=self._client, args=(url, model, timeout))
            for _ in range(CLIENTS)
        ]
        for t in self._threads:
            t.start()

    def _stream(self, url: str, model: str, timeout: float, started=None) -> None:
        r = stream_completion(
            url, model, STREAM_TOKENS, timeout, first_token=started or self.flowing
        )
        with self._lock:
            self.results.append(r)

    def _client(self, url: str, model: str, timeout: float) -> None:
        while not self._stop.is_set():
            self._stream(url, model, timeout)

    def stop(self) -> None:
        self._stop.set()

    def one_more(self, url: str, model: str, timeout: float) -> None:
        """One request arriving just before SIGTERM (endpoint removal is not instant): so a stream
        is in flight at SIGTERM even when the earlier ones all ended during a slow preStop."""
        self._threads.append(
            threading.Thread(target=self._stream, args=(url, model, timeout, self.last_flowing))
        )
        self._threads[-1].start()

    def join(self, timeout: float) -> list[StreamResult]:
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(end - time.monotonic(), 0))
        assert not any(t.is_alive() for t in self._threads), "a client is still waiting"
        return self.results


def kubelet_flags(spec: dict, c: dict, volume_root: pathlib.Path) -> list[str]:
    """`docker run` flags for what kubelet gives this container (the subset the spec uses)."""
    psc, csc = spec["securityContext"], c["securityContext"]
    flags = [
        "--user",
        f"{psc['runAsUser']}:{psc['runAsGroup']}",
        "--group-add",
        str(psc["fsGroup"]),
    ]
    if csc.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    for cap in csc.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", cap]
    if csc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    volumes = {v["name"]: v["emptyDir"] for v in spec["volumes"]}
    for m in c["volumeMounts"]:
        ed = volumes[m["name"]]
        if m["mountPath"] == "/dev/shm":
            assert ed.get("medium") == "Memory"
            flags += ["--shm-size", ed["sizeLimit"].replace("Gi", "g").replace("Mi", "m")]
        else:
            # A disk emptyDir is what kubelet bind-mounts: a fresh host directory, mode 0777.
            # (Docker 20.10's --tmpfs ignores mode= and would leave it root-owned 0755.)
            host = volume_root / m["name"]
            host.mkdir()
            host.chmod(0o777)
            flags += ["-v", f"{host}:{m['mountPath']}"]
    for e in c.get("env", []):
        flags += ["-e", f"{e['name']}={e['value']}"]
    return flags


def exec_rc(cid: str, command: list[str], timeout: float) -> int:
    return subprocess.run(
        [DOCKER, "exec", cid, *command], capture_output=True, timeout=timeout
    ).returncode


# What kubelet's httpGet does, from inside the pod's network namespace: success is 200-399.
HTTP_GET = """import sys, urllib.request, urllib.error
try:
    status = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).status
except urllib.error.HTTPError as e:
    status = e.code
sys.exit(0 if 200 <= status < 400 else 1)"""


def probe_rc(cid: str, probe: dict, timeout: float) -> int:
    """Run a Kubernetes probe (exec or httpGet) against the container: 0 = success."""
    if "exec" in probe:
        return exec_rc(cid, probe["exec"]["command"], timeout)
    get = probe["httpGet"]
    url = f"http://127.0.0.1:{get['port']}{get['path']}"
    python = ["/opt/venv/bin/python", "-c", HTTP_GET, url, str(probe.get("timeoutSeconds", 1))]
    return exec_rc(cid, python, timeout)


@pytest.fixture
def pod(cpu_image, tmp_path):
    spec, c = pod_spec(OVERLAY), container(OVERLAY)
    port = free_port()
    cid = docker(
        "run",
        "-d",
        "--label",
        "io.github.vllm-intel.test=kubelet-termination",
        "-p",
        f"127.0.0.1:{port}:{c['ports'][0]['containerPort']}",
        *kubelet_flags(spec, c, tmp_path),
        cpu_image(),
        *c.get("args", []),
    ).stdout.strip()
    yield spec, c, cid, f"http://127.0.0.1:{port}"
    logs = docker("logs", "--tail", "60", cid, check=False)
    print(logs.stdout[-4000:], logs.stderr[-4000:])
    docker("rm", "-f", cid, check=False)
    # Files the container (uid 10001) wrote into the emptyDirs; pytest removes tmp_path later.
    subprocess.run(["chmod", "-R", "u+rwX", str(tmp_path)], check=False)


def test_kubelet_termination_drains_streams(pod):
    spec, c, cid, url = pod
    grace = spec["terminationGracePeriodSeconds"]

    # startupProbe: until it passes (GET /ready on the probe port), within its budget.
    sp = c["startupProbe"]
    end = time.monotonic() + sp["periodSeconds"] * sp["failureThreshold"]
    while probe_rc(cid, sp, sp["timeoutSeconds"] + 10) != 0:
        state = json.loads(docker("inspect", cid).stdout)[0]["State"]
        assert state["Running"], f"container exited while starting: {state}"
        assert time.monotonic() < end, "startupProbe budget exhausted"
        time.sleep(2)
    assert probe_rc(cid, c["livenessProbe"], 30) == 0

    model = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    traffic = Traffic(url, model, timeout=grace + 60)
    assert traffic.flowing.wait(60), "no stream produced a token within 60 s"

    # kubelet: the grace period starts with the preStop hook; SIGTERM follows when it returns.
    t_kill = time.monotonic() + grace
    prestop_started = time.monotonic()
    rc = exec_rc(cid, c["lifecycle"]["preStop"]["exec"]["command"], grace)
    prestop_took = time.monotonic() - prestop_started
    assert rc == 0 and prestop_took >= prestop_seconds(c) - 0.5, (rc, prestop_took)
    traffic.stop()
    time.sleep(SETTLE_S)
    traffic.one_more(url, model, timeout=grace + 60)
    assert traffic.last_flowing.wait(30), "the last stream produced no token within 30 s"
    t_term = time.monotonic()
    docker("kill", "-s", "TERM", cid)

    # Draining: readiness fails at once (the pod leaves the endpoints), liveness still passes.
    assert probe_rc(cid, c["readinessProbe"], 30) != 0
    assert probe_rc(cid, c["livenessProbe"], 30) == 0

    try:
        docker("wait", cid, timeout=max(t_kill - time.monotonic(), 1))
        exited = time.monotonic()
    except subprocess.TimeoutExpired:
        docker("kill", "-s", "KILL", cid, check=False)  # what kubelet would do now
        pytest.fail(f"still running at terminationGracePeriodSeconds ({grace} s): SIGKILLed")
    results = traffic.join(timeout=60)

    in_flight = sum(r.ended > t_term for r in results)
    print(
        f"preStop {prestop_took:.1f} s, exit {exited - t_term:.1f} s after SIGTERM "
        f"({exited - prestop_started:.1f} s of the {grace} s grace); "
        f"{len(results)} streams, {in_flight} of them in flight at SIGTERM"
    )
    bad = [
        r
        for r in results
        if not (r.status == 200 and r.done and r.finish_reason == "length" and r.error is None)
    ]
    assert not bad, f"streams not completed with [DONE]: {bad}"
    assert in_flight >= 1, "no stream was in flight at SIGTERM: raise STREAM_TOKENS"
    state = json.loads(docker("inspect", cid).stdout)[0]["State"]
    assert state["ExitCode"] == 0, state
    assert exited < t_kill
