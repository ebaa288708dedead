"""Each deploy file's resources, rendered by its own tool (kustomize, Compose), fed to the
entrypoint's plan on simulated nodes: what the plan makes of them is what the files' comments
claim (threads, binding, KV cache), and nothing is pinned."""

from __future__ import annotations

import re

import pytest

from tests.deploy.manifests import K8S, container
from tests.deploy.test_compose import rendered
from tests.harness import ROOT
from vllm_intel.supervisor import plan, workload
from vllm_intel.supervisor.limits import GiB, Limits

BIG_NODES = (16, 64)  # CPUs of a node that runs several pods


def cpu_quantity(value: str) -> float:
    return int(value[:-1]) / 1000 if value.endswith("m") else float(value)


def byte_quantity(value: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": GiB}
    unit = value[-2:]
    return int(value[:-2]) * units[unit] if unit in units else int(value)


def planned(env: dict, args: list[str], quota, memory, node: int, model) -> plan.Plan:
    """The plan `entrypoint.py serve` would log in this container on a `node`-CPU node."""
    lim = Limits("v2", tuple(range(node)), quota, memory, cores=node)
    flags = args[1:] if args[:1] == ["serve"] else args
    return plan.plan(lim, workload.workload(flags, str(model), env), env)


@pytest.mark.parametrize("node", BIG_NODES)
def test_the_k8s_cpu_overlay_gets_what_its_comments_say(node, tiny_model):
    c = container("cpu")
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    limits = c["resources"]["limits"]
    p = planned(
        env, c.get("args", []), cpu_quantity(limits["cpu"]), byte_quantity(limits["memory"]),
        node, tiny_model,
    )  # fmt: skip
    text = (K8S / "cpu" / "deployment-patch.yaml").read_text()
    mem_gi, kv_gib = map(int, re.search(r"here (\d+)Gi -> (\d+) GiB", text).groups())
    cpus, threads = map(int, re.search(r"here (\d+) -> (\d+) threads, `nobind`", text).groups())
    assert byte_quantity(limits["memory"]) == mem_gi * GiB and cpu_quantity(limits["cpu"]) == cpus
    assert (p.kv_gib, p.omp_threads, p.binding) == (kv_gib, threads, "nobind"), p.line()
    assert "not pinned" in p.line(), p.line()


@pytest.mark.parametrize("node", (2, *BIG_NODES))
def test_compose_without_limits_leaves_vllms_threads_and_a_one_gib_kv_cache(node, tiny_model):
    svc = rendered("compose.yaml")["services"]["vllm-cpu"]
    env = {k: v for k, v in svc["environment"].items() if v is not None}
    assert "cpus" not in svc and "mem_limit" not in svc  # what the comment below relies on
    p = planned(env, svc["command"], None, None, node, tiny_model)
    comment = (ROOT / "compose.yaml").read_text()
    assert "1 GiB without one" in comment and "the OpenMP threads from the CPU" in comment
    assert (p.kv_gib, p.omp_threads, p.binding) == (1, None, None), p.line()
    assert "vLLM auto" in p.line()


@pytest.mark.parametrize("node", BIG_NODES)
def test_compose_replicas_do_not_bind_alike(node, tiny_model):
    """The replicas file's claim: nobind, so that replicas on one host do not all bind the first
    cores (vLLM's auto binding would). The plan keeps it as the user's value."""
    svc = rendered("compose.yaml", "compose.replicas.yaml")["services"]["vllm-cpu"]
    env = {k: v for k, v in svc["environment"].items() if v is not None}
    p = planned(env, svc["command"], None, None, node, tiny_model)
    assert p.yours.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind", p.line()
    assert p.threads_text() == "yours", p.line()
