"""Helpers shared by the test files: each imported from here, none from a test file."""
