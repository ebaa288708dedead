"""The run's paths on disk as hostile input, against the fake `vllm serve`: a shared-memory
directory the run cannot write (read-only, full, another user's) is one line and exit 64 with
nothing left behind; the state file's directory, the run directory or TMPDIR swapped for a
symlink while the server runs redirects none of the supervisor's writes or removals to the
files the link points at."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from vllm_intel.supervisor import janitor, probe_client
from vllm_intel.supervisor.errors import Exit

from .conftest import ROOT, SIGTERM, fake_env, free_port

OTHER_UID = 12345
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount, chown)")
USERS = b"the user's own file\n"


@pytest.fixture
def mount(tmp_path):
    """mount(DIR, OPTIONS): a tmpfs on DIR, unmounted at teardown (before tmp_path goes)."""
    mounted = []

    def do(where: pathlib.Path, options: str) -> None:
        argv = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)]
        if subprocess.run(argv, capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(where)

    yield do
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: pathlib.Path) -> None:
    fd = os.open(where / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


# Root writes anywhere: "another user's" runs the supervisor without the capabilities that let it.
AS_NOT_OWNER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


@needs_root
@pytest.mark.parametrize(
    "case", ["read-only", "full", "no inode left", "another user's", "another user's 0700"]
)
def test_a_shm_dir_the_run_cannot_write_is_one_line_and_leaves_nothing(tmp_path, mount, case):
    shm, tmp, model = tmp_path / "shm", tmp_path / "tmp", tmp_path / "model"
    for d in (shm, tmp, model):
        d.mkdir()
    prefix = []
    if case == "read-only":
        mount(shm, "ro,size=1g")  # room enough: only the write is refused
    elif case == "full":
        mount(shm, "size=64k")
        fill(shm)
    elif case == "no inode left":  # room enough (the free-space preflight passes), no new file
        mount(shm, "size=1g,nr_inodes=1")
    else:
        if not shutil.which("setpriv"):
            pytest.skip("needs setpriv")
        os.chown(shm, OTHER_UID, OTHER_UID)
        shm.chmod(0o700 if case.endswith("0700") else 0o755)
        prefix = AS_NOT_OWNER
    env = fake_env(tmp_path, shm=shm, TMPDIR=str(tmp))
    argv = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(model)]
    done = subprocess.run(
        [*prefix, *argv, "--port", str(free_port())],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    out = done.stdout
    lines = [line for line in out.splitlines() if "stale leftover" not in line]
    assert done.returncode == Exit.CONFIG and len(lines) == 1, out
    assert str(shm) in lines[0] and "--shm-size" in lines[0] and "emptyDir" in lines[0], out
    assert "fake vllm" not in out  # refused before anything started
    assert sorted(p.name for p in tmp.iterdir()) == []  # no run directory
    if case != "another user's 0700":  # root can look again, with its capabilities
        assert [p.name for p in shm.iterdir() if "vllm-intel" in p.name] == []  # no claim
    assert not (tmp_path / "state.json").exists()


@needs_root
def test_a_claim_that_cannot_be_written_leaves_no_file(tmp_path, mount):
    """Created, then its content refused (a full shm): the temporary name goes too."""
    shm = tmp_path / "shm"
    shm.mkdir()
    mount(shm, "size=64k")
    fill(shm)
    with pytest.raises(OSError):
        janitor.Claim(shm, tmp_path)
    assert sorted(p.name for p in shm.iterdir()) == ["fill"]


@needs_root
def test_a_state_file_whose_directory_cannot_be_made_is_one_line(run, tmp_path, mount):
    """Made before anything starts (the supervisor then writes through it alone): a read-only
    place is exit 64, not a server whose probe never finds its state."""
    (tmp_path / "ro").mkdir()
    mount(tmp_path / "ro", "ro,size=1m")
    state = tmp_path / "ro" / "sub" / "state.json"
    r = run({"INTEL_VLLM_STATE_FILE": str(state)})
    try:
        r.proc.wait(30)
    except subprocess.TimeoutExpired:
        r.signal(SIGTERM)
    code, out, _ = r.finish()
    assert code == Exit.CONFIG and out.strip().count("\n") == 0, out
    assert f"INTEL_VLLM_STATE_FILE {state}: cannot make its directory" in out, out


# ------------------------------------------------------------------ swapped for a symlink


def swap_for_link(path: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """Move `path` aside and put a symlink to `target` in its place; where it went."""
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    path.symlink_to(target)
    return aside


def serving_state(r, state: pathlib.Path):
    def serving():
        try:
            return json.loads(state.read_text())["state"] == "SERVING"
        except (OSError, ValueError):
            return False

    r.wait_for(serving)


@pytest.mark.parametrize("where", ["INTEL_VLLM_STATE_FILE", "default"])
def test_a_state_dir_swapped_for_a_symlink_redirects_no_write_and_no_unlink(run, tmp_path, where):
    """The state file is rewritten at the drain's start and removed at exit: through the
    directory opened at start, never through the link put in its place."""
    user = tmp_path / "user"
    user.mkdir()
    if where == "default":  # $TMPDIR/vllm-intel-<uid>/vllm-intel-<port>.state.json
        r = run({"INTEL_VLLM_STATE_FILE": ""})
        state = tmp_path / f"vllm-intel-{os.geteuid()}" / f"vllm-intel-{r.port}.state.json"
    else:
        state = tmp_path / "sdir" / "state.json"
        r = run({"INTEL_VLLM_STATE_FILE": str(state)})
    serving_state(r, state)
    mine = user / state.name
    mine.write_bytes(USERS)
    aside = swap_for_link(state.parent, user)
    r.signal(SIGTERM)
    code, out, _ = r.finish()
    assert mine.read_bytes() == USERS, out
    assert code == 0 and "state DRAINING" in out and "cannot write" not in out, out
    assert sorted(p.name for p in aside.iterdir()) == []  # its own file went, where it was


def run_dir_of(tmp: pathlib.Path) -> pathlib.Path:
    (found,) = tmp.glob("vllm-intel-run-*")
    return found


def test_a_run_dir_swapped_for_a_symlink_is_emptied_through_its_fd_alone(run, tmp_path):
    """The run's files go with it wherever the directory was moved; the link's target is kept."""
    r = run()
    r.wait_for(lambda: r.state() == "SERVING")
    path = run_dir_of(tmp_path)
    user = tmp_path / "user"
    user.mkdir()
    for name in [p.name for p in path.iterdir()] + ["precious"]:
        (user / name).write_bytes(USERS)
    aside = swap_for_link(path, user)
    r.signal(SIGTERM)
    code, out, _ = r.finish()
    assert code == 0, out
    assert all(p.read_bytes() == USERS for p in user.iterdir()) and (user / "precious").exists()
    assert path.is_symlink() and sorted(p.name for p in aside.iterdir()) == [], out


def test_a_tmpdir_swapped_for_a_symlink_redirects_no_removal(run, tmp_path):
    """TMPDIR moved and a link put in its place, to a directory holding one of the run
    directory's name: the user's directory is kept, the run's own emptied where it is (its
    name is no longer the run's to remove)."""
    tmp = tmp_path / "t"
    tmp.mkdir()
    r = run({"TMPDIR": str(tmp)})
    r.wait_for(lambda: r.state() == "SERVING")
    name = run_dir_of(tmp).name
    user = tmp_path / "user"
    (user / name).mkdir(parents=True)
    (user / name / "precious").write_bytes(USERS)
    aside = swap_for_link(tmp, user)
    r.signal(SIGTERM)
    code, out, _ = r.finish()
    assert code == 0, out
    assert (user / name / "precious").read_bytes() == USERS, out
    assert sorted(p.name for p in aside.iterdir()) == [name], out
    assert sorted(p.name for p in (aside / name).iterdir()) == [], out


def test_probe_reads_no_state_file_through_a_symlink(tmp_path, capsys, monkeypatch):
    """A link at the state file's name is never the supervisor's (it renames a file there):
    what it points at, however much it looks like a state, makes the probe ask nobody."""
    asked = []
    monkeypatch.setattr(probe_client, "healthy", lambda url, timeout: asked.append(url) or True)
    looks_right = tmp_path / "elsewhere.json"
    looks_right.write_text(json.dumps({"state": "SERVING", "pid": os.getpid(), "port": 1}))
    state = tmp_path / "state.json"
    state.symlink_to(looks_right)
    code = probe_client.probe(["live", "--port", "1"], env={"INTEL_VLLM_STATE_FILE": str(state)})
    assert code == 1 and asked == [], capsys.readouterr()
