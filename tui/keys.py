"""The chat screen's keys: one list for the bindings, the footer and the help screen."""

from __future__ import annotations

from textual.binding import Binding

CHAT_BINDINGS: list[Binding] = [
    Binding("enter", "send", "Send"),
    Binding("ctrl+j", "newline", "Newline"),
    Binding("escape", "stop", "Stop", priority=True),
    Binding("ctrl+r", "regenerate", "Regenerate", priority=True),
    Binding("ctrl+n", "new_chat", "New chat", priority=True),
    Binding("f1", "help", "Help", priority=True),
    Binding("f2", "system_prompt", "System", priority=True),
    Binding("f3", "settings", "Settings", priority=True),
    Binding("f4", "pick_model", "Model", priority=True),
    Binding("f5,ctrl+o", "conversations", "Chats", priority=True),
    Binding("ctrl+q", "app.quit", "Quit", priority=True),
]

HELP_ROWS: list[tuple[str, str]] = [
    ("enter", "send the message"),
    ("shift+enter, ctrl+j", "start a new line in the message"),
    ("escape", "stop the reply being generated"),
    ("ctrl+r", "regenerate the last reply"),
    ("ctrl+n", "start a new chat (the current one stays saved)"),
    ("f1", "this help"),
    ("f2", "edit the system prompt"),
    ("f3", "sampling settings: temperature, top-k, top-p, min-p, …"),
    ("f4", "switch model (pulls it from the catalog if needed)"),
    ("f5, ctrl+o", "saved chats: resume or delete"),
    ("ctrl+q", "quit"),
]
