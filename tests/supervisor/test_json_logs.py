"""INTEL_VLLM_LOG_FORMAT=json: the relay's line handling, vLLM's JSON logging config applied by
logging.config, and a whole serve/drain/stop run against the fake vLLM in which every line the
entrypoint writes (stdout and stderr) parses as a JSON object."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.harness import ROOT, free_port
from vllm_intel.in_vllm import jsonlog
from vllm_intel.supervisor import relay

FIELDS = {"time", "level", "source", "event", "message"}


@pytest.mark.parametrize(
    "raw, want",
    [
        (b"plain text\n", {"message": "plain text", "event": "output", "stream": "stderr"}),
        (b"10%|#   |\r50%|#####  |\r100%|########|\n", {"message": "100%|########|"}),
        (b'{"already": "json"}\n', {"already": "json"}),
        (b'{"not json\n', {"message": '{"not json'}),
        (b"\xff\xfe bytes\n", {"message": "\ufffd\ufffd bytes"}),
    ],
)
def test_each_line_becomes_one_json_object(raw, want):
    out = json.loads(relay.as_json_line(raw, "stderr"))
    assert want.items() <= out.items(), out
    if "already" not in want:
        assert FIELDS <= out.keys() and out["source"] == "vllm"


def test_blank_lines_are_dropped_and_long_lines_cut():
    assert relay.as_json_line(b"  \n", "stdout") is None
    buf = bytearray()
    assert relay.split_lines(buf, b"a\nb") == [b"a\n"] and buf == b"b"
    assert relay.split_lines(buf, b"c" * relay.MAX_LINE)[0] == b"b" + b"c" * (relay.MAX_LINE - 1)


def test_vllms_loggers_and_uvicorns_access_log_write_json():
    stream = io.StringIO()
    config = jsonlog.logging_config()
    config["handlers"]["json"]["stream"] = stream
    logging.config.dictConfig(config)
    try:
        logging.getLogger("vllm.entrypoints.api_server").info("Starting %s", "server")
        logging.getLogger("uvicorn.access").info('127.0.0.1 - "GET /health HTTP/1.1" 200')
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("vllm.engine").exception("failed")
    finally:
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["logger"], r["level"]) for r in lines] == [
        ("vllm.entrypoints.api_server", "info"),
        ("uvicorn.access", "info"),
        ("vllm.engine", "error"),
    ]
    assert lines[0]["message"] == "Starting server" and FIELDS <= lines[0].keys()
    assert "ValueError: boom" in lines[2]["exception"]


def test_a_serve_drain_stop_run_is_json_line_by_line(run):
    r = run({"INTEL_VLLM_LOG_FORMAT": "json", "FAKE_DRAIN": "0.5"})
    r.wait_for(lambda: r.state() == "SERVING")
    r.signal(signal.SIGTERM)
    code, out, _ = r.finish()
    assert code == 0, out
    records = [json.loads(line) for line in out.splitlines()]  # every line, or this raises
    assert all(FIELDS <= rec.keys() for rec in records), records
    states = [rec["state"] for rec in records if rec["event"] == "state"]
    assert states == ["STARTING", "SERVING", "DRAINING"], states
    (exit_line,) = [rec for rec in records if rec["event"] == "exit"]
    assert exit_line["code"] == 0 and exit_line["source"] == "entrypoint"
    relayed = [rec["message"] for rec in records if rec["event"] == "output"]
    assert any("got SIGTERM" in m for m in relayed), relayed  # the fake vLLM's own print


def test_a_bad_log_format_is_exit_64_in_one_line(run):
    r = run({"INTEL_VLLM_LOG_FORMAT": "yaml"})
    code, out, _ = r.finish()
    assert code == 64 and out.count("\n") == 1 and "INTEL_VLLM_LOG_FORMAT" in out, out


LOG_WHILE_RELAYING = """
import os, sys, threading
from vllm_intel.supervisor.log import log
from vllm_intel.supervisor.relay import Relay
relay = Relay()
out_w, err_w = relay.child_fds()
def vllm():
    for i in range({n}):
        os.write(err_w, b"vllm line %d\\n" % i)
    os.close(out_w)
    os.close(err_w)
writer = threading.Thread(target=vllm)
writer.start()
pump = threading.Thread(target=relay.pump, args=(60,))  # the loop's part, here from a thread
pump.start()
for i in range({n}):
    log(f"supervisor line {{i}}", event="state")
writer.join()
pump.join()
"""


def test_the_supervisors_lines_and_relayed_lines_never_share_a_line(tmp_path):
    """Two threads write the same stderr (e.g. the probe port's log and the loop's relay);
    without one lock around whole lines a relayed line landed between a message and its newline
    (~5% of lines with 3000 of each)."""
    n = 3000
    err = tmp_path / "stderr"
    with err.open("wb") as f:
        subprocess.run(
            [sys.executable, "-c", LOG_WHILE_RELAYING.format(n=n)],
            env={**os.environ, "INTEL_VLLM_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)},
            stderr=f,
            check=True,
            timeout=60,
        )
    records = [json.loads(line) for line in err.read_text().splitlines()]
    assert len(records) == 2 * n
    assert sorted(r["message"] for r in records) == sorted(
        [f"supervisor line {i}" for i in range(n)] + [f"vllm line {i}" for i in range(n)]
    )


ENDLESS_OUTPUT = """
import select, subprocess, sys
from vllm_intel.supervisor.relay import Relay
relay = Relay()
out_w, err_w = relay.child_fds()
yes = subprocess.Popen(["yes", "vllm line"], stdout=err_w)
select.select([relay.err_r], [], [], 60)  # printing has begun
reads, read = [], relay.read
relay.read = lambda fd: (reads.append(fd), read(fd))
relay.pump(0)
yes.kill()
print(len(reads), file=sys.__stdout__, flush=True)
"""


def test_a_tick_of_the_relay_ends_while_vllm_keeps_printing(tmp_path):
    """The loop pumps vLLM's pipes on every tick: a process that never stops printing must not
    hold the loop (its signals, its deadline) in one tick. Bounded by what it reads, not by a
    time (a busy host stretches the time, never the count): at most twice the pipes' size."""
    from vllm_intel.supervisor.relay import PIPE_SIZE, READ_SIZE

    r = subprocess.run(
        [sys.executable, "-c", ENDLESS_OUTPUT],
        env={**os.environ, "INTEL_VLLM_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0 and 0 < int(r.stdout) <= 2 * PIPE_SIZE // READ_SIZE, r.stdout


# vLLM printing long lines on both streams, without end (a thread of the fake vLLM).
CHATTY = """
import os, threading, time
def chatter():
    for i in range(10**9):
        os.write(1 + i % 2, b"line %d %s\\n" % (i, b"x" * 1500))
        time.sleep(0.001)
threading.Thread(target=chatter, daemon=True).start()
"""


def test_a_slow_log_reader_gets_whole_json_lines_and_the_exit_record(tmp_path):
    """The supervisor's stdout and stderr are one pipe read slowly (a log shipper behind): when a
    write's wait runs out mid-line, the rest of that line comes before any other line (the
    supervisor's records and vLLM's lines were glued onto half lines), lines not started are
    dropped whole, and the exit record comes."""
    from .conftest import fake_env
    from .test_descendants import fake_with

    env = {**fake_env(tmp_path, INTEL_VLLM_LOG_FORMAT="json"), **fake_with(tmp_path, CHATTY)}
    argv = [sys.executable, str(ROOT / "entrypoint.py"), "serve", str(tmp_path / "model")]
    proc = subprocess.Popen(
        [*argv, "--port", str(free_port())],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    got = bytearray()

    def slow_reader():
        while chunk := os.read(proc.stdout.fileno(), 4096):
            got.extend(chunk)
            time.sleep(0.01)

    reader = threading.Thread(target=slow_reader)
    reader.start()
    try:
        end = time.monotonic() + 60
        while len(got) < 1 << 20 and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.05)
        assert len(got) >= 1 << 20, bytes(got[-2000:])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=60)
    lines = bytes(got).split(b"\n")
    assert lines[-1] == b"", lines[-1][-200:]  # the last line whole too
    bad = [line[:120] for line in lines[:-1] if not _is_json_object(line)]
    assert bad == [], f"{len(bad)} of {len(lines) - 1} lines are not one JSON object: {bad[:3]}"
    records = [json.loads(line) for line in lines[:-1]]
    assert [r["code"] for r in records if r["event"] == "exit"] == [0]
    assert any(r["event"] == "output" for r in records)


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


HALF_A_LINE = """
import os, sys
from vllm_intel.supervisor import log
log.write_lines(1, b"a" * 100000 + b"\\n")  # the pipe holds 64 KiB, nobody reads: cut mid-line
log.write_lines(2, b"next\\n")  # the same pipe (2>&1): not before the rest of the long line
open(sys.argv[1], "w").write(repr(log.lost))
sys.stdin.read(1)  # the reader has read all there was
log.write_lines(2, b"after\\n")
"""


def test_a_line_cut_mid_way_is_finished_before_any_other(tmp_path):
    """stdout and stderr on one pipe nobody reads for a while: the rest of the line the wait cut
    is kept and comes first; the line that could not start is dropped whole, and counted."""
    r, w = os.pipe()
    lost = tmp_path / "lost"
    proc = subprocess.Popen(
        [sys.executable, "-c", HALF_A_LINE, str(lost)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=w,
        stderr=w,
    )
    os.close(w)
    try:
        end = time.monotonic() + 30
        while not lost.exists() and time.monotonic() < end:
            time.sleep(0.05)
        got = os.read(r, 1 << 20)  # what the pipe held: the start of the long line
        proc.stdin.write(b"x")
        proc.stdin.close()
        while chunk := os.read(r, 1 << 20):
            got += chunk
        assert proc.wait(timeout=30) == 0
    finally:
        os.close(r)
        if proc.poll() is None:
            proc.kill()
    assert got == b"a" * 100000 + b"\nafter\n", got[-100:]
    assert lost.read_text() == "{1: 0, 2: 1}"
