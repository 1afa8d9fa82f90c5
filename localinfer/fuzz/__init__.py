"""Fuzzing harnesses: the HTTP API (schemathesis) and the GGUF reader (atheris)."""
