"""A stand-in for `vllm serve`, for the supervisor's signal tests (dumb-init style).

It prints every signal it receives (`got SIGTERM`), answers GET /health on --port once
FAKE_READY_AFTER seconds have passed, and behaves on SIGTERM as FAKE_ON_TERM says:
  exit:N      exit with code N after FAKE_DRAIN seconds
  ignore      keep running (the supervisor must escalate)
  die:SIG     kill itself with signal SIG
FAKE_ORPHAN=1 starts a grandchild in the same process group that outlives us and ignores SIGTERM.
FAKE_SHM=NAME creates NAME in INTEL_VLLM_SHM_DIR and keeps it mapped, as vLLM does its psm_*
segments (and leaves it behind, as a killed vLLM does).
FAKE_ZOMBIE=PATH leaves an orphan (its pid written to PATH) that exits after 1.5 s: re-parented to
the supervisor, which must reap it. FAKE_EXIT_AFTER=S,N exits by itself with code N after S seconds (an "engine death").
Its HTTP server starts once its signal handlers are installed: a test that got an answer from
it knows a signal sent from then on reaches the handler. GET /metrics answers FAKE_RUNNING
requests running (default 0) in Prometheus text once FAKE_METRICS_AFTER seconds have passed (default FAKE_READY_AFTER: before its engine is up, vLLM
answers nothing); FAKE_METRICS=hang makes it never answer (the supervisor must forward signals
regardless). Each "got SIG..." line
carries the wall-clock time it arrived (`at T`). Its lines also go to the file FAKE_LOG when set;
FAKE_QUIET=1 prints nothing (a stalled stdout would block it); a line that cannot be printed (a
closed or full pipe) is lost, as vLLM's logging loses it, never an exception.
"""

import http.server
import os
import signal
import subprocess
import sys
import threading
import time


def say(line: str) -> None:
    if os.environ.get("FAKE_LOG"):
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(line + "\n")
    if os.environ.get("FAKE_QUIET") != "1":
        try:
            print(line, flush=True)
        except OSError:
            pass


args = sys.argv[1:]
port = int(args[args.index("--port") + 1]) if "--port" in args else 8000
say("fake vllm argv: " + " ".join(args))
start = time.monotonic()
ready_after = float(os.environ.get("FAKE_READY_AFTER", "0"))
metrics_after = float(os.environ.get("FAKE_METRICS_AFTER", ready_after))
terms = []

if os.environ.get("FAKE_SHM"):
    import mmap

    segment = open(os.path.join(os.environ["INTEL_VLLM_SHM_DIR"], os.environ["FAKE_SHM"]), "w+b")
    segment.truncate(4096)
    mapped = mmap.mmap(segment.fileno(), 4096)

if os.environ.get("FAKE_ZOMBIE"):
    subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os,sys,time\nif os.fork() == 0:\n"
            " open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(1.5)",
            os.environ["FAKE_ZOMBIE"],
        ]
    ).wait()


def on_signal(sig, frame):
    say(f"got {signal.Signals(sig).name} at {time.time():.6f}")
    if sig == signal.SIGTERM:
        terms.append(time.monotonic())


for s in (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGQUIT,
    signal.SIGWINCH,
    signal.SIGCONT,
    signal.SIGALRM,
    signal.SIGPWR,
    signal.SIGRTMIN,
    signal.SIGRTMAX,
):
    signal.signal(s, on_signal)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/metrics":
            if os.environ.get("FAKE_METRICS") == "hang" or time.monotonic() - start < metrics_after:
                time.sleep(3600)
            running = os.environ.get("FAKE_RUNNING", "0")
            body = (
                f"# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="m"}} {running}\n'
            ).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
            return
        ok = self.path == "/health" and time.monotonic() - start >= ready_after
        self.send_response(200 if ok else 503)
        self.end_headers()

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()

if os.environ.get("FAKE_ORPHAN"):
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal,time,os;signal.signal(signal.SIGTERM,signal.SIG_IGN);"
            "open(os.environ['FAKE_ORPHAN'],'w').write(str(os.getpid()));time.sleep(600)",
        ]
    )


mode = os.environ.get("FAKE_ON_TERM", "exit:0")
exit_after = os.environ.get("FAKE_EXIT_AFTER")
while True:
    time.sleep(0.05)
    if exit_after:
        secs, code = exit_after.split(",")
        if time.monotonic() - start >= float(secs):
            say("fake vllm: exiting by itself")
            os._exit(int(code))
    if (
        terms
        and mode != "ignore"
        and time.monotonic() - terms[0] >= float(os.environ.get("FAKE_DRAIN", "0"))
    ):
        kind, _, val = mode.partition(":")
        say(f"fake vllm: drained, {mode}")
        if kind == "die":
            signal.signal(getattr(signal, val), signal.SIG_DFL)
            os.kill(os.getpid(), getattr(signal, val))
        os._exit(int(val))
