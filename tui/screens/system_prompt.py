"""SystemPromptScreen: edit the system prompt of the current chat."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, TextArea


class SystemPromptScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, system: str) -> None:
        super().__init__()
        self.system = system

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="system-prompt"):
            yield Label("System prompt", classes="dialog-title")
            yield TextArea(self.system, id="system-text", soft_wrap=True)
            yield Label("ctrl+s saves · escape cancels · empty means none", classes="hint")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_save(self) -> None:
        self.dismiss(self.query_one(TextArea).text.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
