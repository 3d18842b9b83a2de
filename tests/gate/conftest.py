"""The gate's store tests open the same stores the results tests do: SQLite and the real PostgreSQL."""

from tests.results.conftest import store, store_url

__all__ = ["store", "store_url"]
