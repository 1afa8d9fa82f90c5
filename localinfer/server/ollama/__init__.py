"""The Ollama API beside the OpenAI one: /api/tags, /api/show, /api/pull, /api/delete,
/api/version (routes_models.py) and /api/chat, /api/generate (routes_generate.py), with the
pieces they share: Ollama's JSON shapes and errors (shapes.py), `options`/`format`/`tools`
mapped onto a generation's fields (options.py), Ollama prompts as token ids (prompts.py) and
the answer objects and NDJSON lines (answers.py). Requests run on the same engine path and
model pool as the OpenAI routes.
"""
