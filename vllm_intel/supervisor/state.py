"""The supervisor's states, as the loop moves through them and the probes read them."""

from __future__ import annotations

import enum


class State(enum.Enum):
    STARTING = "STARTING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    KILLING = "KILLING"
