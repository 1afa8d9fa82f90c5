"""`localinfer bench`: localinfer and llama.cpp side by side on one GGUF file, as ratios.

Every measurement group runs in its own child process (worker.py), so each side's peak RSS is
its own and one side's threads or caches cannot slow the other. The parent (orchestrate.py)
runs the groups in turn, shows progress on stderr, and report.py turns the numbers into a
table and a JSON file.
"""
