"""The supervisor deletes only what it created or provably owns: never a directory a user named,
never through a symlink, never another user's files, never what a live run still lists; and what
`probe` reads from the state file is checked before it signals or asks anything."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from tests.harness import ROOT
from vllm_intel.supervisor import errors, janitor, loop, paths, probe_client, settings
from vllm_intel.supervisor.errors import ConfigError, Exit

OTHER_UID = 12345
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to another uid)")


def _exit_or_stop(r, within: float = 10.0):
    """The entrypoint's (code, output): a run that did not refuse to start is stopped, so that
    its clean-up runs and what it would remove is gone when the test looks."""
    try:
        r.proc.wait(within)
    except subprocess.TimeoutExpired:
        r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    return code, out


# ---------------------------------------------------------------------------------- the state file


def _user_data(tmp_path: pathlib.Path) -> pathlib.Path:
    models = tmp_path / "models"
    (models / "sub").mkdir(parents=True)
    (models / "weights.bin").write_bytes(b"precious")
    return models


@pytest.mark.parametrize(
    "where",
    [
        "{models}",  # a directory: its content went with the supervisor's exit
        "{models}/sub/..",  # no file name, as `/` has none: the clean-up reached rmtree
        "{models}/weights.bin/state.json",  # under a file
        "{link}",  # a symlink: replaced, then the user's link removed at exit
    ],
)
def test_a_state_file_that_is_not_a_file_path_is_refused_and_left_alone(run, tmp_path, where):
    models = _user_data(tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(models / "weights.bin")
    value = where.format(models=models, link=link)
    code, out = _exit_or_stop(run({"INTEL_VLLM_STATE_FILE": value}))
    assert (models / "weights.bin").read_bytes() == b"precious"
    assert (models / "sub").is_dir() and link.is_symlink()
    assert code == Exit.CONFIG, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and f"INTEL_VLLM_STATE_FILE {value}" in lines[0], out
    assert "fake vllm" not in out  # refused before anything started


def test_root_is_refused_as_a_state_file():
    """`/` made write_state raise ValueError (Path.with_name) and the clean-up rmtree('/')."""
    with pytest.raises(ConfigError, match="INTEL_VLLM_STATE_FILE /: names a directory"):
        paths.check_state_file(pathlib.Path("/"))


def _supervisor(state: pathlib.Path) -> loop.Supervisor:
    return loop.Supervisor(settings.ServeConfig(argv=["true"], port=1, drain=0, notes=[]), state)


def test_writing_the_state_does_not_follow_a_symlink_planted_at_a_predictable_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    state = tmp_path / "state.json"
    (tmp_path / "state.json.tmp").symlink_to(victim)  # where the state used to be written first
    _supervisor(state).write_state()
    assert victim.read_text() == "precious"
    st = os.lstat(state)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert json.loads(state.read_text())["state"] == "STARTING"
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == ["state.json", "state.json.tmp", "victim"]


def test_the_state_file_is_removed_at_exit_only_while_it_is_the_one_written(tmp_path):
    state = tmp_path / "state.json"
    sup = _supervisor(state)
    sup.write_state()
    sup.remove_state()
    assert not state.exists()
    sup.write_state()
    state.unlink()  # a user's directory took its place while the server ran
    (state / "keep").mkdir(parents=True)
    sup.remove_state()
    assert (state / "keep").is_dir()
    state.rename(tmp_path / "moved")
    state.write_text("a user's own file, another inode")
    sup.remove_state()
    assert state.read_text() == "a user's own file, another inode"


# ---------------------------------------------------------------------------------- the sweep


def _dirs(tmp_path):
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    tmp.mkdir()
    return shm, tmp


def _segments(shm, *names):
    for name in names:
        (shm / name).write_bytes(b"x" * 64)


def _dead_claim(shm, run_dir, names) -> pathlib.Path:
    claim = janitor.Claim(shm, run_dir)
    claim.add(set(names))
    os.close(claim.fd)
    return claim.path


def test_a_forged_world_writable_claim_removes_nothing(tmp_path):
    """Anyone who can write /dev/shm can write a claim: only mode 0600 files of ours count."""
    shm, tmp = _dirs(tmp_path)
    _segments(shm, "psm_a1")  # a live server's, in a namespace we cannot see
    forged = shm / f"{janitor.CLAIM_PREFIX}forged{janitor.CLAIM_SUFFIX}"
    forged.write_text(json.dumps({"run_dir": str(tmp), "shm": ["psm_a1"]}))
    forged.chmod(0o666)
    found = janitor.sweep(shm, tmp, in_use=set)
    assert found.removed == [] and found.foreign == [str(forged)]
    assert (shm / "psm_a1").exists() and forged.exists()


def test_a_symlinked_claim_is_not_followed(tmp_path):
    shm, tmp = _dirs(tmp_path)
    _segments(shm, "psm_b2")
    victim = tmp_path / "victim.json"  # a file of ours, mode 0600, that happens to parse
    content = json.dumps({"run_dir": str(tmp), "shm": ["psm_b2"], "mine": True})
    victim.write_text(content)
    victim.chmod(0o600)
    link = shm / f"{janitor.CLAIM_PREFIX}link{janitor.CLAIM_SUFFIX}"
    link.symlink_to(victim)
    st = (shm / "psm_b2").stat()
    # psm_b2 mapped: the old sweep rewrote the claim it had opened through the link
    first = janitor.sweep(shm, tmp, in_use=lambda: {(st.st_dev, st.st_ino)})
    assert victim.read_text() == content
    second = janitor.sweep(shm, tmp, in_use=set)
    assert (shm / "psm_b2").exists() and link.is_symlink() and victim.read_text() == content
    assert first.removed == second.removed == [] and first.foreign == [str(link)]


@needs_root
def test_another_users_claim_is_left_alone(tmp_path):
    shm, tmp = _dirs(tmp_path)
    _segments(shm, "psm_c3")
    claim = _dead_claim(shm, tmp, ["psm_c3"])
    os.chown(claim, OTHER_UID, OTHER_UID)
    found = janitor.sweep(shm, tmp, in_use=set)
    assert found.removed == [] and found.foreign == [str(claim)]
    assert (shm / "psm_c3").exists() and claim.exists()


@needs_root
def test_another_users_entry_under_a_name_a_dead_claim_of_ours_lists_stays(tmp_path):
    shm, tmp = _dirs(tmp_path)
    _segments(shm, "psm_f6")
    os.chown(shm / "psm_f6", OTHER_UID, OTHER_UID)
    _dead_claim(shm, tmp, ["psm_f6"])
    janitor.sweep(shm, tmp, in_use=set)
    assert (shm / "psm_f6").exists()


def test_a_name_a_live_claim_lists_survives_a_dead_claim_listing_it_too(tmp_path):
    shm, tmp = _dirs(tmp_path)
    _segments(shm, "psm_d4", "psm_e5")
    live = janitor.Claim(shm, tmp)
    live.add({"psm_d4"})
    dead = _dead_claim(shm, tmp, ["psm_d4", "psm_e5"])
    try:
        found = janitor.sweep(shm, tmp, in_use=set)
        assert sorted(found.removed) == sorted([str(shm / "psm_e5"), str(dead)])
        assert (shm / "psm_d4").exists()
    finally:
        live.release()


def test_leftover_names_match_in_full(tmp_path):
    assert janitor.is_vllm_shm("psm_1f") and not janitor.is_vllm_shm("psm_1f\n")
    shm, tmp = _dirs(tmp_path)
    _segments(shm, "psm_1f\n")
    _dead_claim(shm, tmp, ["psm_1f\n"])
    janitor.sweep(shm, tmp, in_use=set)
    assert (shm / "psm_1f\n").exists()


@needs_root
def test_another_users_run_directory_is_left_alone(tmp_path):
    shm, tmp = _dirs(tmp_path)
    theirs = tmp / f"{paths.RUN_DIR_PREFIX}theirs"
    theirs.mkdir(mode=0o700)
    os.close(janitor.create_locked(theirs / janitor.LOCK_FILE))  # its lock free: a dead run's
    (theirs / "data").write_text("theirs")
    for p in (theirs, theirs / janitor.LOCK_FILE, theirs / "data"):
        os.chown(p, OTHER_UID, OTHER_UID)
    found = janitor.sweep(shm, tmp, in_use=set)
    assert found.removed == [] and found.foreign == [str(theirs)]
    assert (theirs / "data").read_text() == "theirs"


AS_OTHER_USER = textwrap.dedent(
    """
    import os, pathlib, sys
    sys.path.insert(0, sys.argv[3])
    from vllm_intel.supervisor import janitor
    os.setgid({uid}); os.setuid({uid})
    with janitor.run_dir(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])) as run:
        print("started in", run.path, flush=True)
    """
).format(uid=OTHER_UID)


@needs_root
def test_another_users_private_run_directory_does_not_stop_a_start(tmp_path):
    """In a shared /tmp a run directory we cannot look into: the start goes on, one line says
    what was left alone (it was a PermissionError traceback)."""
    tmp_path.chmod(0o755)
    shm, tmp = _dirs(tmp_path)
    shm.chmod(0o1777)
    tmp.chmod(0o1777)
    theirs = tmp / f"{paths.RUN_DIR_PREFIX}x"
    theirs.mkdir(mode=0o700)  # root's here: the one we cannot look into is not ours
    os.close(janitor.create_locked(theirs / janitor.LOCK_FILE))
    done = subprocess.run(
        [sys.executable, "-c", AS_OTHER_USER, str(tmp), str(shm), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "started in" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if str(theirs) in line]
    assert len(lines) == 1 and "left alone" in lines[0], done.stderr
    assert (theirs / janitor.LOCK_FILE).exists()


# ---------------------------------------------------------------------------------- probe

GOOD = {"state": "STARTING", "pid": os.getpid(), "port": 1, "url": "http://127.0.0.1:1"}


@pytest.mark.parametrize(
    "content,message",
    [
        ({**GOOD, "pid": 0}, "pid 0 is not a process id"),  # kill(0, 0): our own group, alive
        ({**GOOD, "pid": -1}, "pid -1 is not a process id"),  # kill(-1, 0): every process
        ({**GOOD, "pid": True}, "pid True is not a process id"),
        ({**GOOD, "pid": str(os.getpid())}, "is not a process id"),
        ({**GOOD, "pid": 2**64}, "is not a process id"),  # OverflowError in os.kill
        ({**GOOD, "state": "EXPLODED"}, "unknown state 'EXPLODED'"),
        ({k: v for k, v in GOOD.items() if k != "state"}, "unknown state None"),
        ({**GOOD, "url": "http://192.0.2.1:8000"}, "is not on this host"),  # TEST-NET-1
        ({**GOOD, "url": "http://example.com:8000"}, "is not on this host"),
        ({**GOOD, "url": "file:///etc/passwd"}, "is not an http(s) URL"),
        ({**GOOD, "url": "http://127.0.0.1:99999"}, "is not a URL"),
        ([1], "not a JSON object"),  # a TypeError traceback
        (b"not json{", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
    ],
)
def test_probe_refuses_a_state_file_no_supervisor_wrote(
    tmp_path, capsys, monkeypatch, content, message
):
    asked = []
    monkeypatch.setattr(probe_client, "healthy", lambda url, timeout: asked.append(url) or True)
    state = tmp_path / "state.json"
    state.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    code = probe_client.probe(["live", "--port", "1"], env={"INTEL_VLLM_STATE_FILE": str(state)})
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and asked == []
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"not live: state file {state}: "), err
    assert message in lines[0], err


@pytest.mark.parametrize(
    "url",
    [None, "http://127.0.0.1:1", "http://127.0.0.2:1", "http://[::1]:1", "https://localhost:1"],
)
def test_probe_accepts_what_a_supervisor_writes(tmp_path, capsys, monkeypatch, url):
    """Not a bug's test: the addresses `poll_url` writes stay accepted."""
    monkeypatch.setattr(probe_client, "healthy", lambda url, timeout: True)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({**GOOD, "state": "SERVING", "url": url}))
    code = probe_client.probe(["ready", "--port", "1"], env={"INTEL_VLLM_STATE_FILE": str(state)})
    assert code == 0, capsys.readouterr()


def test_default_state_file_lives_in_a_private_directory_of_this_user(tmp_path, monkeypatch):
    """On a shared /tmp nobody else can plant the default state file or the directory it is in:
    the directory is made 0700 and accepted only as ours; another user's is refused in one line."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = paths.state_file(8123, env={})
    assert path.parent == tmp_path / f"vllm-intel-{os.geteuid()}"
    paths.check_state_file(path)
    st = os.lstat(path.parent)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    paths.check_state_file(path)  # again: it is ours now
    os.chmod(path.parent, 0o755)
    with pytest.raises(errors.ConfigError, match="not this user's private directory"):
        paths.check_state_file(path)
    os.rmdir(path.parent)
    path.parent.symlink_to(tmp_path)
    with pytest.raises(errors.ConfigError, match="not this user's private directory"):
        paths.check_state_file(path)
