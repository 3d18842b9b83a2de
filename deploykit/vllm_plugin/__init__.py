"""Everything deploykit runs inside vLLM's own processes (API server, engine core, workers).

vLLM reaches this package through deploykit's entry point (`deploykit.plugin_contract.ENTRY_POINT`); the
control side (`plan`, `serve`, `smoke`, `trace`, `render`) never imports it, and it imports only the fixes
and the ground floor (import-linter contracts in pyproject.toml). What the two sides share, names and the
trace-file schema, lives in `deploykit.plugin_contract` and `deploykit.trace_records`.

- entry.py          `register()`: the vLLM general-plugin entry point
- applied.py        the fixes DEPLOYKIT_FIXES names, and those applied in this process
- status_route.py   `GET /deploykit/status`, answered by the engine workers (collective_rpc)
- worker_status.py  what one engine process answers it: its ranks, node and host, the fixes applied in it
- trace_hooks.py    forward hooks on the served model for `deploykit trace`

Nothing heavy at import: vLLM, torch and FastAPI are imported inside functions.
"""
