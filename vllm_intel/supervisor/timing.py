"""The drain and everything timed around it: one formula for the deadline and the grace period
that compose, Kubernetes and `entrypoint.py grace-period` all use.

Why the default drain is what it is: docs/bench.md, "The drain window: why 120 s" (the answers a
real-size model has in flight at SIGTERM must finish inside it; an idle stop does not wait for it).
"""

from __future__ import annotations

from .errors import Exit

DEFAULT_DRAIN_S = 120
XPU_MIN_DRAIN_S = 5  # XPU workers need it to release Level Zero / oneCCL resources
MAX_DRAIN_S = 86400  # one day: a longer drain is a typo, and grace-period must print a sane number
TEARDOWN_S = 10  # vLLM stops its engine core and workers after the drain
MARGIN_S = 5  # the orchestrator's slack after our own deadline
KILL_GRACE_S = 3  # the group gets SIGTERM this long before the SIGKILL
ORPHAN_GRACE_S = 2  # after the API server exits, before what is left of its group is SIGKILLed
EXIT_S = 1  # the supervisor's own exit after its last wait: the run directory, the exit line
PRESTOP_S = 5  # deploy/k8s: the preStop sleep before kubelet's SIGTERM (tests/deploy checks it)

TICK_S = 0.5  # the loop's wait; also the observer's poll period
HEALTH_TIMEOUT_S = 2.0  # a loaded host can take over a second to answer /health while starting
METRICS_TIMEOUT_S = 1.0


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
deadline = DRAIN + TEARDOWN ({TEARDOWN_S} s) after the first SIGTERM: the process group is SIGTERMed {KILL_GRACE_S} s
           before it and SIGKILLed at it; the entrypoint then exits {Exit.FORCED.value}
grace    = DRAIN + TEARDOWN + MARGIN ({MARGIN_S} s) = {grace_period(DEFAULT_DRAIN_S)} s by default
exit by  = grace - {EXIT_S} s: every wait after a stop (orphans, the metrics linger) ends by then"""

ORCHESTRATOR_FORMULA = f"""\
grace = DRAIN + TEARDOWN ({TEARDOWN_S} s) + MARGIN ({MARGIN_S} s)          `entrypoint.py grace-period` prints it
compose stop_grace_period             = grace                        ({grace_period(DEFAULT_DRAIN_S)} s by default)
Kubernetes terminationGracePeriodSeconds = preStop sleep + grace     ({PRESTOP_S} + {grace_period(DEFAULT_DRAIN_S)} = {PRESTOP_S + grace_period(DEFAULT_DRAIN_S)} s by default)"""
