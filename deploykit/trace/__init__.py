"""`deploykit trace`: name the first module of a served model whose output went non-finite.

run.py starts vLLM and runs the cases, report.py reads what the hooks wrote and names the culprit. The
hooks themselves run inside vLLM's worker process (`deploykit.vllm_plugin.trace_hooks`, installed by the
plugin only when DEPLOYKIT_TRACE is set); the records they write are `deploykit.trace_records`, and the
names both sides use (DEPLOYKIT_TRACE, the files' names) are `deploykit.plugin_contract`'s.
"""
