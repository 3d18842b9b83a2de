"""`deploykit trace`: name the first module of a served model whose output went non-finite.

hooks.py runs inside vLLM's worker process (installed by the plugin only when DEPLOYKIT_TRACE is set),
report.py reads what the hooks wrote and names the culprit, run.py starts vLLM and runs the cases.
"""

TRACE_ENV = "DEPLOYKIT_TRACE"
