"""`deploykit gate`: a candidate deployment (another vLLM release, driver, dtype or fix set) judged against
the fleet's baseline before it rolls out: `promote`, or `hold` with the reason (docs/gate.md).

  `model`        the report and its parts (pydantic: what the row, the JSON report and the screen carry),
  `load_sample`  a short streamed load at the profile's stream counts (TPOT, throughput),
  `measure`      one side measured: smoke, known answers and fix check, fingerprint twice, KV cache, version,
  `baseline`     the stored baseline a candidate is compared with when no baseline server is given,
  `launch`       a side deploykit starts itself (another profile, another vLLM environment),
  `judge`        the verdict from two measured sides (pure),
  `run`          the whole gate: both sides, the verdict, the row, `--adopt`,
  `report`       the one-screen report.
"""
