"""Fakes at library boundaries, so tests of deploykit's own logic run on every CI box."""
