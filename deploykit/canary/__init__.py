"""The canary: keep checking a running server's output, because some corruption comes later.

`defaults` (every default, read by the CLI and by whoever acts on the verdict), `settings` (what a person
sets), `state` (the pure state machine), `rotation` (the cheap cases each run sends), `progress` (is the
engine working: tokens, steps, quiet on purpose), `nan_counter` (vLLM's NaN counter on live traffic),
`server_page` (the one read of the server's /metrics per tick that feeds both), `metrics` (Prometheus),
`verdict` (the verdict file the pod's probes read), `rows` (the rows it stores), `runner` (`Canary`: a run,
a page, the one transition every change goes through), `runtime` (`CanaryRuntime`: the one owner of its
threads and their stop), `listener` (`/healthz`, `/livez`, `/metrics`), `discovery` (what the server is and
serves), `config` (the command's options → a `CanaryConfig`), `command` (`deploykit canary`).

Nothing is imported here: `deploykit.canary.defaults` must stay as cheap as a constant for the CLI.
"""
