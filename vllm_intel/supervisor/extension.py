"""The one interface between the supervisor's loop and what runs beside it.

The core (loop.Supervisor) knows only this class. Each part beside it is an Extension that
cli.supervise makes and passes in, or leaves out: the probe port's /metrics (metrics.Metrics), the
shared-memory watch of the run (janitor.Run), the JSON log relay (relay.Relay), the download
progress (hub.DownloadProgress), what vLLM's processes report in the run directory
(reports.RunReports), its OOM kills and the processes that outlive it (leftovers.OomKills,
leftovers.Descendants).

The loop calls the hooks from its own thread, in the order the extensions were given:
  on_spawn(sup)  once, when vLLM's API server runs (sup.child)
  on_state(sup)  after each change of sup.state (written to the state file and logged)
  on_tick(sup)   every turn of the loop (at least every TICK_S), every TICK_S while the loop
                 waits for vLLM's processes to exit, and once before the exit line; returns at once
  ready_words(sup)  " (...)" the "ready" line adds, or ""
  on_group_gone(sup)  once, when vLLM's process group is gone (or killed), before the exit line;
                 every wait in it ends by sup.time_left(...)
  exit_words(sup)  "; ..." the exit line adds, or ""
  on_exit(sup)   once, after vLLM's exit; every wait in it ends by sup.time_left(...)
A hook that raises is a bug of ours: it is not swallowed.
"""

from __future__ import annotations


class Extension:
    def on_spawn(self, sup) -> None:
        pass

    def on_state(self, sup) -> None:
        pass

    def on_tick(self, sup) -> None:
        pass

    def ready_words(self, sup) -> str:
        return ""

    def on_group_gone(self, sup) -> None:
        pass

    def exit_words(self, sup) -> str:
        return ""

    def on_exit(self, sup) -> None:
        pass
