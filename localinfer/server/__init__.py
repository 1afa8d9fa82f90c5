"""The OpenAI-compatible HTTP server (`localinfer serve`). Needs the [server] extra.

Nothing here is imported by `import localinfer`; the CLI loads it only for `serve`.
"""
