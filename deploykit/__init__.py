"""deploykit: makes a vLLM deployment correct on the GPU it lands on."""

__version__ = "0.1.0"
