"""What runs inside vLLM's processes (API server, engine core, workers), beside the patches: the
run directory's files (run_files), the start-up phases and the drain forecast they write there, the
JSON log format and the exit without interpreter finalization. The standard library only: these
modules are imported before and beside vLLM, never the other way round."""
