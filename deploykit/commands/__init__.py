"""Command groups that live outside cli.py. Each module has `register(app)` and imports nothing heavy
at module level, so `deploykit --help` stays fast."""
