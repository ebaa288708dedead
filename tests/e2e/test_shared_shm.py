"""Several servers on one host: two real `entrypoint.py serve` share /dev/shm and /tmp, the second in
a PID namespace of its own, which is what two containers started with `--ipc=host` (or two
containers of a pod sharing a memory emptyDir) are. Neither may remove the other's live shared
memory; a crashed server's leftovers go at its next start, and nothing of the live one's."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import tempfile

import psutil
import pytest
import requests

from tests.harness import alive, descendants, poll
from vllm_intel.supervisor import janitor

SHM = pathlib.Path("/dev/shm")
FLAGS = ("--enforce-eager", "--max-model-len", "512")
# What a container runtime gives a container: its own PID namespace and /proc.
OWN_PID_NAMESPACE = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")


def entries(server) -> set[str]:
    """The vLLM shm entries the server's processes map (by inode: semaphores too)."""
    tree = janitor.tree_of(server.pid)
    used = janitor.files_in_use(tree)
    return {e.name for e in janitor.vllm_entries(SHM) if janitor.inode(e) in used}


def queues(server) -> set[str]:
    """Its shared-memory segments (multiprocessing's `psm_`: vLLM's message queues), which live
    as long as the run; other entries come and go while it starts."""
    return {n for n in entries(server) if n.startswith("psm_")}


def removed(server) -> set[str]:
    """The entries its supervisor's start-up sweep removed, from the line that names them."""
    lines = re.findall(r"removed \d+ stale leftover\(s\)[^\n]*", server.text())
    return {pathlib.Path(p).name for line in lines for p in line.split(": ", 1)[1].split()}


def complete(server) -> None:
    r = requests.post(
        server.url + "/v1/completions",
        json={"model": server.model, "prompt": "def main(", "max_tokens": 8},
        timeout=60,
    )
    assert r.status_code == 200, r.text


# vLLM 0.32.0's API server sometimes logs its output handler's EngineDeadError right after a clean
# engine stop (single servers do it too: a shutdown race of its own, unrelated to shared memory).
VLLM_SHUTDOWN_RACE = "[async_llm.py:906]"


def stop(server) -> None:
    # The supervisor: for the server in its own namespace, unshare's child (unshare itself would
    # pass the signal on as --kill-child's SIGKILL), as a container runtime signals PID 1.
    supervisor = server.pid
    if os.path.basename(server.proc.args[0]) == "unshare":
        supervisor = psutil.Process(server.pid).children()[0].pid
    os.kill(supervisor, signal.SIGTERM)
    assert server.wait(60) == 0, server.tail()
    text = "\n".join(l for l in server.text().splitlines() if VLLM_SHUTDOWN_RACE not in l)
    assert "Traceback" not in text and "FileNotFoundError" not in text, text[-4000:]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"
)
def test_two_servers_share_dev_shm_and_only_a_dead_runs_leftovers_go(serve):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))  # one /tmp for all of them
    claims_before = claims()
    a = serve(*FLAGS, tmp=tmp, wait=False)
    # b starts once a's processes map their shared-memory queues, a still loading: b's
    # supervisor sweeps /dev/shm at its start beside a's live segments, and the starts overlap.
    poll(lambda: queues(a), timeout=240, what="the first server maps its shm queues")
    swept_beside = queues(a)
    b = serve(*FLAGS, tmp=tmp, prefix=OWN_PID_NAMESPACE, wait=False)
    for s in (a, b):
        s.wait_ready()
        s.model = s.model_name()
    a_entries = entries(a)
    # b's supervisor cannot see a's processes, yet left every entry of a's alone: it removed
    # none (a dead run's, from an earlier test, it may), and a still has every one it mapped.
    assert not removed(b) & (swept_beside | a_entries), removed(b)
    assert {n for n in swept_beside | a_entries if (SHM / n).exists()} == swept_beside | a_entries
    b_entries = entries(b)
    assert b_entries and not (a_entries & b_entries)
    complete(a)
    complete(b)

    # a crashes: supervisor, API server, engine and workers SIGKILLed at once.
    family = [a.pid] + descendants(a.pid)
    for pid in family:
        os.kill(pid, signal.SIGKILL)
    a.proc.wait()
    # As an orchestrator restarts a crashed container: once its processes are all gone.
    poll(lambda: not alive(family), timeout=30, what="the crashed server's processes are gone")
    left = {n for n in a_entries if (SHM / n).exists()}
    assert left, "the crash left nothing in /dev/shm: the case is not exercised"

    a2 = serve(*FLAGS, tmp=tmp)  # a's next start, next to the live b
    swept = removed(a2)
    assert swept, a2.text()[-3000:]
    assert left <= swept, (left, swept)
    assert not swept & b_entries, swept
    assert all((SHM / n).exists() for n in b_entries)
    assert not any((SHM / n).exists() for n in left)
    complete(b)
    complete(a2)

    stop(a2)
    stop(b)
    assert not any((SHM / n).exists() for n in b_entries)
    assert claims() <= claims_before  # both runs released their claims (a dead one may go too)
    assert not list(tmp.glob("vllm-intel-run-*"))


def claims() -> set[str]:
    return {p.name for p in SHM.glob(f"{janitor.CLAIM_PREFIX}*{janitor.CLAIM_SUFFIX}")}
