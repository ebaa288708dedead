"""The loop's one interface to what runs beside it (vllm_intel/supervisor/extension.py): each hook
is called from the loop's thread, in the order the extensions were given, at the moment its
contract names; the real loop runs a real child (in a process of its own: the loop blocks the
signals it waits for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.harness import ROOT, free_port

RUN = textwrap.dedent(
    """\
    import json, os, pathlib, sys, threading
    from vllm_intel.supervisor import loop, settings
    from vllm_intel.supervisor.extension import Extension

    calls = []

    class Recorder(Extension):
        def __init__(self, name):
            self.name = name

        def record(self, hook, sup, *what):
            assert threading.current_thread() is threading.main_thread()  # the loop's thread
            calls.append([self.name, hook, *what])

        def on_spawn(self, sup):
            self.record("spawn", sup, sup.state.value, sup.child.pid > 0)

        def on_state(self, sup):
            self.record("state", sup, sup.state.value)

        def on_tick(self, sup):
            if calls[-1][:2] != [self.name, "tick"]:  # every turn; recorded once in a row
                self.record("tick", sup, sup.returncode)

        def on_group_gone(self, sup):
            self.record("group gone", sup, sup.returncode, sup.group_alive())

        def exit_words(self, sup):
            self.record("exit words", sup, sup.returncode)
            return f"; {self.name} said"

        def on_exit(self, sup):
            self.record("exit", sup, sup.returncode)

    child = [sys.executable, "-c", "import time; time.sleep(0.5)"]
    cfg = settings.ServeConfig(argv=child, port=int(sys.argv[1]), drain=1, notes=[])
    sup = loop.Supervisor(cfg, pathlib.Path(sys.argv[2]), [Recorder("a"), Recorder("b")])
    loop.Supervisor.block_signals()
    assert sup.spawn(dict(os.environ)) is None
    code = sup.run()
    calls.append(["loop", "returned", int(code)])
    sup.exit_extensions()
    print(json.dumps(calls))
    """
)


def test_the_loop_calls_each_hook_in_order_from_its_thread(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", RUN, str(free_port()), str(tmp_path / "state.json")],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    calls = json.loads(r.stdout.splitlines()[-1])
    # The child exits by itself (0, no stop request): the loop's exit code 70 (errors.Exit).
    assert calls[:4] == [
        ["a", "state", "STARTING"],
        ["b", "state", "STARTING"],
        ["a", "spawn", "STARTING", True],
        ["b", "spawn", "STARTING", True],
    ], calls
    assert calls[4:6] == [["a", "tick", None], ["b", "tick", None]], calls
    gone = calls.index(["a", "group gone", 0, False])  # after the group is gone, before the line
    assert calls[gone + 1] == ["b", "group gone", 0, False], calls
    assert calls[-5:] == [
        ["a", "exit words", 0],
        ["b", "exit words", 0],
        ["loop", "returned", 70],
        ["a", "exit", 0],
        ["b", "exit", 0],
    ], calls
    assert all(c[1] in ("tick", "state") for c in calls[4:gone] + calls[gone + 2 : -5]), calls
    # the exit line carries the extensions' words, in their order
    assert "without a stop request; a said; b said" in r.stderr, r.stderr[-3000:]
