"""Helpers shared by the test suites (on sys.path through pytest\x27s pythonpath setting)."""
