"""GPU facts: the NVML reader (plain dicts and json, no pydantic), the GPU table, the facts schema, and
`load` (a live probe or a saved file as a validated record). Nothing is imported here, so the JSON path
stays light."""
