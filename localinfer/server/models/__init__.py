"""Several models in one server: which models may be served and under what names (served.py),
the memory each needs against the budget (memory_plan.py), one loaded model's slot and a
request's lease on it (slot.py), the pool that loads on demand and unloads idle models
(pool.py, with keep_alive.py's durations), what the Ollama routes say of a GGUF (cards.py),
and the loaded-models routes GET /api/ps and POST /api/unload (routes_loaded.py). Kept light:
`localinfer serve` reads keep_alive and memory_plan before the server's own imports.
"""
