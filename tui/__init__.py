"""localinfer.tui: the Textual chat app (a later issue)."""
