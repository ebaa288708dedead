"""The janitor's decisions with real locks, real files and real processes (no vLLM): what a dead
run claimed goes, what a live run claims stays - also when the live run is in another PID
namespace - and what nobody claims is reported, never removed."""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import janitor
from vllm_intel.supervisor.paths import RUN_DIR_PREFIX


def _files(shm, *names):
    for name in names:
        (shm / name).write_bytes(b"x" * 64)


def _dead_claim(shm, run_dir, names):
    """A claim whose supervisor died: written, then its lock released without the release()."""
    claim = janitor.Claim(shm, run_dir)
    claim.add(set(names))
    os.close(claim.fd)
    return claim.path


def _run_dir(tmp, name, locked):
    d = tmp / f"{RUN_DIR_PREFIX}{name}"
    d.mkdir()
    fd = janitor.create_locked(d / janitor.LOCK_FILE)
    if not locked:
        os.close(fd)
    return d, fd


def test_sweep_removes_only_what_dead_runs_claimed(tmp_path):
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    # vllm_intel_wake_*: the futex words of patch shm-busy-sleep, vLLM entries like the rest
    _files(shm, "psm_11", "sem.mp-live", "psm_22", "sem.mp-dead", "psm_33", "unrelated")
    _files(shm, "vllm_intel_wake_2d", "vllm_intel_wake_3c")
    live_dir, live_fd = _run_dir(tmp, "live", locked=True)
    dead_dir, _ = _run_dir(tmp, "dead", locked=False)
    unknown_dir = tmp / f"{RUN_DIR_PREFIX}unknown"  # an older or foreign run: no lock file
    unknown_dir.mkdir()
    live = janitor.Claim(shm, live_dir)
    live.add({"psm_11", "sem.mp-live"})
    dead = _dead_claim(shm, dead_dir, ["psm_22", "sem.mp-dead", "vllm_intel_wake_2d", "psm_gone"])

    found = janitor.sweep(shm, tmp, in_use=set)

    assert sorted(found.removed) == sorted(
        [str(shm / n) for n in ("psm_22", "sem.mp-dead", "vllm_intel_wake_2d")]
        + [str(dead), str(dead_dir)]
    )
    unclaimed = [str(shm / "psm_33"), str(shm / "vllm_intel_wake_3c"), str(unknown_dir)]
    assert sorted(found.unclaimed) == sorted(unclaimed)
    left = sorted(p.name for p in shm.iterdir())
    kept = ["psm_11", "sem.mp-live", "psm_33", "vllm_intel_wake_3c", "unrelated", live.path.name]
    assert left == sorted(kept)
    assert live_dir.exists() and unknown_dir.exists() and not dead_dir.exists()
    live.release()
    os.close(live_fd)


def test_a_dead_runs_entry_that_a_visible_process_still_maps_stays(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    _files(shm, "psm_44", "psm_55")
    _dead_claim(shm, tmp_path, ["psm_44", "psm_55"])
    st = (shm / "psm_55").stat()
    found = janitor.sweep(shm, tmp_path / "none", in_use=lambda: {(st.st_dev, st.st_ino)})
    assert found.removed == [str(shm / "psm_44")] and (shm / "psm_55").exists()
    # The claim stays, listing what is left, so the next sweep (nobody maps it then) finishes.
    found = janitor.sweep(shm, tmp_path / "none", in_use=set)
    assert str(shm / "psm_55") in found.removed and sorted(p.name for p in shm.iterdir()) == []


def test_release_removes_this_runs_claimed_entries_and_the_claim(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    _files(shm, "psm_66", "psm_77")
    claim = janitor.Claim(shm, tmp_path)
    claim.add({"psm_66"})
    assert claim.release() == [str(shm / "psm_66")]
    assert sorted(p.name for p in shm.iterdir()) == ["psm_77"]  # never claimed: not ours to remove


def test_a_claim_cut_mid_write_reads_as_empty(tmp_path):
    path = tmp_path / "c"
    path.write_bytes(b'{"shm": ["psm_1"')
    fd = os.open(path, os.O_RDONLY)
    try:
        assert janitor.read_claim(fd) == {}
    finally:
        os.close(fd)


HOLDER = textwrap.dedent(
    """
    import mmap, os, pathlib, sys, time
    sys.path.insert(0, sys.argv[3])
    from vllm_intel.supervisor import janitor
    shm, run_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    seg = shm / f"psm_{os.getpid():x}"
    seg.write_bytes(b"x" * 4096)
    f = open(seg, "r+b"); m = mmap.mmap(f.fileno(), 4096)     # mapped, as vLLM's segments are
    claim = janitor.Claim(shm, run_dir)
    janitor.Watcher(claim, shm, os.getpid()).scan()
    print(seg.name, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"
)
def test_a_live_run_in_another_pid_namespace_is_seen_through_its_lock(tmp_path):
    """What two containers sharing /dev/shm are: the holder's processes are invisible to us."""
    shm = tmp_path / "shm"
    shm.mkdir()
    holder = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",  # the namespace dies with the holder, as a container does
            "--mount-proc",
            sys.executable,
            "-c",
            HOLDER,
            str(shm),
            str(tmp_path),
            str(ROOT),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        name = holder.stdout.readline().strip()
        assert name.startswith("psm_"), name
        found = janitor.sweep(shm, tmp_path / "none")  # the real process view
        assert found.removed == [] and (shm / name).exists()
    finally:
        holder.kill()
        holder.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the namespace's init exits, then the kernel frees the lock
        found = janitor.sweep(shm, tmp_path / "none")
        if found.removed:
            break
        time.sleep(0.1)
    assert str(shm / name) in found.removed and not (shm / name).exists()


def test_the_watcher_records_what_the_run_maps(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    _files(shm, "psm_88")
    claim = janitor.Claim(shm, tmp_path)
    with open(shm / "psm_88", "r+b") as f, mmap.mmap(f.fileno(), 64):
        janitor.Watcher(claim, shm, os.getpid()).scan()
    assert claim.names == {"psm_88"}
    assert janitor.read_claim(claim.fd)["shm"] == ["psm_88"]
    claim.release()


def test_the_watcher_claims_intel_openmps_registrations_of_the_runs_pids(tmp_path):
    """libiomp5 writes `__KMP_REGISTERED_LIB_<pid>_<uid>` and unmaps it: the pid in the name says
    whose it is; another process's stays unclaimed (never removed by this run)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    mine, other = f"__KMP_REGISTERED_LIB_{os.getpid()}_0", "__KMP_REGISTERED_LIB_1_0"
    _files(shm, mine, other)
    claim = janitor.Claim(shm, tmp_path)
    janitor.Watcher(claim, shm, os.getpid()).scan()
    assert claim.names == {mine}
    claim.release()
    assert sorted(f.name for f in shm.iterdir()) == [other]


def _wait(condition, timeout: float = 10.0) -> None:
    """Until condition() holds (then at once), or timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


@contextlib.contextmanager
def _watching(monkeypatch, shm):
    """A Watcher on this process at a 10 ms period, ticked as the loop does while the block runs:
    (its claim, scan times)."""
    monkeypatch.setattr(janitor, "WATCH_FAST_S", 0.01)
    claim = janitor.Claim(shm, shm.parent)
    watcher = janitor.Watcher(claim, shm, os.getpid())
    scans: list[float] = []
    real_scan = watcher.scan
    watcher.scan = lambda *args: (scans.append(time.monotonic()), real_scan(*args))
    stop = threading.Event()

    def loop():  # the supervisor's loop, turning faster than the watcher's period
        while not stop.is_set():
            watcher.tick()
            stop.wait(0.002)

    turning = threading.Thread(target=loop, daemon=True)
    turning.start()
    try:
        yield claim, scans
    finally:
        stop.set()
        turning.join(5)


def test_the_watcher_reads_no_maps_while_nothing_new_is_there(tmp_path, monkeypatch):
    """A scan reads every process's maps: none while there is nothing unclaimed to find."""
    shm = tmp_path / "shm"
    shm.mkdir()
    _files(shm, "not-vllm")
    with _watching(monkeypatch, shm) as (claim, scans):
        time.sleep(0.3)
    assert scans == [] and claim.names == set()
    claim.release()


def test_the_watcher_stops_scanning_once_what_it_can_claim_is_claimed(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    _files(shm, "psm_77", "psm_99")  # psm_99: another server's, never mapped here
    with open(shm / "psm_77", "r+b") as f, mmap.mmap(f.fileno(), 64):
        with _watching(monkeypatch, shm) as (claim, scans):
            _wait(lambda: claim.names == {"psm_77"})
            time.sleep(0.5)  # fifty periods more: scans past the bound would show
    assert claim.names == {"psm_77"}
    # psm_99 stays unclaimed: scanned after each change of the unclaimed set, then left alone
    assert 1 <= len(scans) <= 2 * janitor.SCANS_AFTER_CHANGE, scans
    claim.release()


def test_the_watcher_claims_an_entry_mapped_a_moment_after_it_appeared(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    with _watching(monkeypatch, shm) as (claim, _):
        time.sleep(0.05)
        _files(shm, "psm_66")  # created: the watcher sees a new unclaimed entry ...
        time.sleep(0.015)
        with open(shm / "psm_66", "r+b") as f, mmap.mmap(f.fileno(), 64):  # ... mapped after
            _wait(lambda: "psm_66" in claim.names)
    assert claim.names == {"psm_66"}
    claim.release()
