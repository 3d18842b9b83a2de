"""The canary: keep checking a running server's output, because some corruption comes later.

`defaults` (every default, read by the CLI and by whoever acts on the verdict), `state` (the pure state
machine), `rotation` (the cheap cases each run sends), `metrics` (Prometheus), `verdict` (the verdict file
the pod's probes read), `rows` (the rows it stores), `runner` (`Canary`: a run, its state, metrics, rows),
`listener` (`/healthz`, `/livez`, `/metrics`), `discovery` (what the server is and serves), `config` (the
command's options → a `CanaryConfig`), `command` (`deploykit canary`).

Nothing is imported here: `deploykit.canary.defaults` must stay as cheap as a constant for the CLI.
"""
