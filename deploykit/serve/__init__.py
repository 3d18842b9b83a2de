"""`deploykit serve`: profile → probe → plan → a running vLLM → smoke verdict → one stored row.

attempt (the stages, `run_serve`), launch (vLLM in its own process group), console (the terminal),
signals (SIGINT/SIGTERM), remote_smoke (`deploykit smoke` against a running server), helpers (shared).
"""
