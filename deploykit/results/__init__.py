"""deploykit's results: one row per `deploykit serve` / `smoke` / `trace` attempt and the canary's rows, kept
in a store, and the fingerprint baselines of a fleet. Floors, from the bottom (pyproject's contracts):

- `record`: what a row is (`ResultRecord`); needs neither SQLAlchemy nor any store, so the vLLM image's
  sidecars (`smoke --no-store`, the canary) build rows with what it has;
- `baseline`, `urls`: a baseline's record, and a store's URL as given, shown and normalised;
- `store`: the `Store` protocol, the seam every command writes and reads through;
- `judge`, `spool`: a fingerprint judged against its baseline; rows kept while their store is away;
- `sql`: the SQL store (SQLite, PostgreSQL): engine, schema and migrations, rows, baselines;
- `store_row`: the last step of every command that stores a row.

This package imports no module of its own on import: `deploykit.results.record` stays light.
"""
