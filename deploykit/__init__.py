"""deploykit: makes a vLLM deployment correct on the GPU it lands on."""

__version__ = "0.1.0"
# The distribution's name on an index. The import package and the command are `deploykit`, but the PyPI
# name `deploykit` belongs to an unrelated project: nothing may ever resolve that bare name from an index.
DISTRIBUTION = "vllm-deploykit"
