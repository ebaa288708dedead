"""The shutdown timeline, each step defined here once: the drain (and its XPU floor), the
drain-deadline patch's admission wait and abort inside vLLM, the deadline, the grace period that
compose, Kubernetes and `entrypoint.py grace-period` use, and the supervisor's exit-by. The
patches import it inside vLLM's processes: it imports `errors` only (no torch, no psutil).

Why the default drain is what it is: docs/bench.md, "The drain window: why 120 s" (the answers a
real-size model has in flight at SIGTERM must finish inside it; an idle stop does not wait for it).
"""

from __future__ import annotations

from .errors import Exit

DEFAULT_DRAIN_S = 120
XPU_MIN_DRAIN_S = 5  # upstream's floor: XPU workers need it to release Level Zero / oneCCL
MAX_DRAIN_S = 86400  # one day: a longer drain is a typo, and grace-period must print a sane number
TEARDOWN_S = 10  # vLLM stops its engine core and workers after the drain
MARGIN_S = 5  # the orchestrator's slack after our own deadline
KILL_GRACE_S = 3  # the group gets SIGTERM this long before the SIGKILL
ORPHAN_GRACE_S = 2  # after the API server exits, before what is left of its group is SIGKILLed
EXIT_S = 1  # the supervisor's own exit after its last wait: the run directory, the exit line
ABORT_LEAD_S = 2  # drain-deadline aborts what is unfinished this long before the window ends
ADMIT_WAIT_S = 2  # drain-deadline waits at most this long for accepted requests to reach vLLM
PRESTOP_S = 5  # deploy/k8s: the preStop sleep before kubelet's SIGTERM (tests/deploy checks it)

TICK_S = 0.5  # the loop's wait; also the observer's poll period
HEALTH_TIMEOUT_S = 2.0  # a loaded host can take over a second to answer /health while starting
METRICS_TIMEOUT_S = 1.0


def admit_wait(drain: float) -> float:
    """The longest the API server waits at SIGTERM, before the engine's drain starts, for the
    requests it accepted to reach the engine: ADMIT_WAIT_S, at most a quarter of the drain."""
    return min(ADMIT_WAIT_S, drain / 4)


def abort_at(drain: float) -> float:
    """Seconds into the engine's drain at which drain-deadline aborts what is unfinished, so every
    stream ends with `abort` and `[DONE]` inside the window: ABORT_LEAD_S before its end, at most
    a quarter of the drain."""
    return drain - min(ABORT_LEAD_S, drain / 4)


def grace_period(drain: int) -> int:
    """What compose stop_grace_period / Kubernetes terminationGracePeriodSeconds must allow."""
    return drain + TEARDOWN_S + MARGIN_S


def deadline(drain: int) -> int:
    """Seconds after the first SIGTERM at which the process group is SIGKILLed."""
    return drain + TEARDOWN_S


def exit_by(drain: int) -> int:
    """Seconds after the first SIGTERM by which every wait of the supervisor has ended (the
    orphans' grace, the metrics linger, the log relay's last lines): EXIT_S before the grace
    period's end, when the orchestrator SIGKILLs."""
    return grace_period(drain) - EXIT_S


SHUTDOWN_FORMULA = f"""\
DRAIN    = vLLM's --shutdown-timeout if you give it (command line, else --config file),
           else INTEL_VLLM_DRAIN_TIMEOUT                           default {DEFAULT_DRAIN_S} s
           on XPU at least {XPU_MIN_DRAIN_S} s (vLLM's XPU workers release their devices in it)
admit    = within min({ADMIT_WAIT_S} s, DRAIN/4) of SIGTERM the requests accepted before it reach vLLM's
           engine; the engine's drain of DRAIN s starts then (the drain-deadline patch)
abort    = DRAIN - min({ABORT_LEAD_S} s, DRAIN/4) into the engine's drain ({abort_at(DEFAULT_DRAIN_S):g} s by default): what is
           unfinished is aborted, each stream ends with `abort` and [DONE] (drain-deadline)
deadline = DRAIN + TEARDOWN ({TEARDOWN_S} s) after the first SIGTERM: the process group is SIGTERMed {KILL_GRACE_S} s
           before it and SIGKILLed at it; the entrypoint then exits {Exit.FORCED.value}
grace    = DRAIN + TEARDOWN + MARGIN ({MARGIN_S} s) = {grace_period(DEFAULT_DRAIN_S)} s by default
exit by  = grace - {EXIT_S} s: every wait after a stop (orphans, the metrics linger) ends by then"""

ORCHESTRATOR_FORMULA = f"""\
grace = DRAIN + TEARDOWN ({TEARDOWN_S} s) + MARGIN ({MARGIN_S} s)          `entrypoint.py grace-period` prints it
compose stop_grace_period             = grace                        ({grace_period(DEFAULT_DRAIN_S)} s by default)
Kubernetes terminationGracePeriodSeconds = preStop sleep + grace     ({PRESTOP_S} + {grace_period(DEFAULT_DRAIN_S)} = {PRESTOP_S + grace_period(DEFAULT_DRAIN_S)} s by default)"""
