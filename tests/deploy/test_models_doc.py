"""docs/models.md: every command on the page, checked against what it drives (compose.yaml, the
CPU Dockerfile, the cpu-hub overlay, the entrypoint's subcommands), so the page cannot drift."""

from __future__ import annotations

import re
import shlex

import pytest

from vllm_intel.supervisor import cli

from .manifests import K8S, ROOT, compose, compose_default, dockerfile_env, one, render

DOC = ROOT / "docs" / "models.md"
IMAGE = dockerfile_env("cpu")
HF_HOME = IMAGE["HF_HOME"]


def commands() -> list[list[str]]:
    """Every command of the page's ```sh blocks, continuation lines joined, comments dropped."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            # `a && b`: two commands
            while "&&" in words:
                i = words.index("&&")
                out.append(words[:i])
                words = words[i + 1 :]
            if words:
                out.append(words)
    return out


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def of(tool: str) -> list[tuple[dict[str, str], list[str]]]:
    found = [split_env(list(c)) for c in commands()]
    return [(env, w) for env, w in found if w and w[0] == tool]


def test_the_page_has_commands_for_compose_docker_and_kubernetes():
    tools = {w[0] for _, w in (split_env(list(c)) for c in commands()) if w}
    assert {"scripts/compose.sh", "docker", "kubectl"} <= tools


def compose_settings() -> set[str]:
    text = (ROOT / "compose.yaml").read_text()
    return set(re.findall(r"\$\{(\w+)", text)) | set(compose()["x-vllm-env"])


def test_compose_commands_use_settings_compose_reads():
    svc = compose()["services"]["vllm-cpu"]
    known = compose_settings()
    for env, words in of("scripts/compose.sh"):
        assert set(env) <= known, set(env) - known
        if "run" in words:  # `run --rm SERVICE SUBCOMMAND`
            rest = [w for w in words[words.index("run") + 1 :] if not w.startswith("-")]
            assert rest[0] in compose()["services"] and rest[1] in cli.COMMANDS, words
    # The table's defaults are compose.yaml's.
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", DOC.read_text(), re.M))
    # SOURCE:TARGET[:ro], SOURCE being `${VAR:-default}` (a colon of its own)
    split = (re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::ro)?", v) for v in svc["volumes"])
    volumes = {m[2]: m[1] for m in split}
    assert (
        compose_default(volumes[HF_HOME]) == "hf-cache"
        and "`hf-cache`" in rows["INTEL_VLLM_HF_CACHE"]
    )
    assert compose_default(volumes["/models"]) == "./build/models"
    assert "hf-cache" in compose()["volumes"]
    (env_file,) = svc["env_file"]
    assert env_file["required"] is False
    assert rows["INTEL_VLLM_HF_ENV_FILE"] == f"`{compose_default(env_file['path'])}`"
    assert rows["HF_HUB_OFFLINE"] == f"`{compose_default(svc['environment']['HF_HUB_OFFLINE'])}`"
    assert IMAGE["HF_HUB_OFFLINE"] == "1"  # offline by default, as the page says
    assert (
        rows["INTEL_VLLM_START_PERIOD"]
        == f"`{compose_default(svc['healthcheck']['start_period'])}`"
    )
    assert "hf.env" in (ROOT / ".gitignore").read_text().split()


@pytest.mark.parametrize("i", range(2))
def test_docker_run_commands_match_the_image_and_compose(i):
    runs = [w for _, w in of("docker") if w[1] == "run"]
    assert len(runs) == 2
    words = runs[i]
    svc = compose()["services"]["vllm-cpu"]
    opts, image = {}, words[-1]
    it = iter(words[2:-1])
    for w in it:
        if w in ("-d",):
            continue
        opts.setdefault(w, []).append(next(it))
    assert image == compose_default(svc["image"])
    assert opts["--shm-size"] == [compose_default(svc["shm_size"])]
    assert opts["-p"] == ["127.0.0.1:8000:8000"]
    env = dict(e.split("=", 1) for e in opts["-e"])
    assert "HF_TOKEN" not in env  # the token only through --env-file
    assert set(env) <= compose_settings()
    mounts = {v.split(":")[1]: v.split(":") for v in opts["-v"]}
    assert set(mounts) <= {"/models", HF_HOME}
    if "/models" in mounts:
        assert mounts["/models"][2] == "ro" and env["INTEL_VLLM_MODEL"].startswith("/models/")
    else:
        assert env["HF_HUB_OFFLINE"] == "0" and opts["--env-file"] == ["hf.env"]
        assert mounts[HF_HOME][0] == "hf-cache"
        created = [w for _, w in of("docker") if w[1:3] == ["volume", "create"]]
        assert created == [["docker", "volume", "create", "hf-cache"]]


def test_kubernetes_commands_match_the_overlay():
    docs = render("cpu-hub")
    dep = one(docs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    # The init container downloads, so it alone gets the token.
    token = {e["name"]: e for e in spec["initContainers"][0]["env"]}["HF_TOKEN"]["valueFrom"][
        "secretKeyRef"
    ]
    kubectl = [w for _, w in of("kubectl")]
    secret = next(w for w in kubectl if w[1:3] == ["create", "secret"])
    assert secret[3:5] == ["generic", token["name"]]
    assert "--from-env-file=hf.env" in secret  # key = the name in the file: HF_TOKEN
    assert token["key"] == "HF_TOKEN" and "HF_TOKEN=hf_" in DOC.read_text()
    apply = next(w for w in kubectl if w[1] == "apply")
    assert apply[2] == "-k" and (ROOT / apply[3] / "kustomization.yaml").exists()
    assert (ROOT / apply[3]).resolve() == (K8S / "cpu-hub").resolve()
    logs = next(w for w in kubectl if w[1] == "logs")
    assert logs[logs.index("-c") + 1] in {c["name"] for c in spec["initContainers"]}
    assert f"deploy/{dep['metadata']['name']}" in logs
    claim = one(docs, "PersistentVolumeClaim")
    text = DOC.read_text()
    assert claim["spec"]["resources"]["requests"]["storage"].replace("Gi", " Gi") in text
    assert f"`{claim['metadata']['name']}`" in text and f"`{token['name']}`" in text


def test_readme_links_the_page():
    assert "docs/models.md" in (ROOT / "README.md").read_text()
