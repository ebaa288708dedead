"""The PID-1 supervisor behind entrypoint.py: settings, loop, observe, janitor, probes, cli."""
