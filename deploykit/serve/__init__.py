"""`deploykit serve`: profile → probe → plan → a running vLLM → smoke verdict → one stored row.

stages (one attempt's life cycle, each stage once; also composed by `deploykit trace`), attempt
(`run_serve`: the first attempt), watch (serving mode: the in-process canary, restarts), remote_smoke
(`deploykit smoke` against a running server), options, launch (vLLM in its own process group), console
(the terminal), signals (SIGINT/SIGTERM), helpers (pure pieces the stages share).
"""
