"""localinfer.tui: `localinfer chat` — the Textual app (app.py, screens/, widgets/) and the
textual-free parts it shares with the --plain REPL (conversation, store, session, plain)."""
