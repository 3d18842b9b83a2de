"""The SQL results store (SQLite, PostgreSQL): `store` opens one (`open_store`); `schema` its tables and
migrations, `engine` its dialects, `rows` and `baselines` what it reads and writes, `errors` the driver's
failures as one line. Nothing here is imported on import."""
