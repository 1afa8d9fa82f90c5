"""SettingsScreen: sampling settings of the current chat (temperature, top-p, max tokens)."""

from __future__ import annotations

from localinfer.tui.conversation import ChatSettings
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from localinfer.errors import LocalInferError

FIELDS = (
    ("temperature", "Temperature", "0 = greedy; higher = more varied"),
    ("top_p", "Top-p", "nucleus sampling, in (0, 1]"),
    ("max_tokens", "Max tokens", "longest reply, in tokens"),
)


class SettingsScreen(ModalScreen[ChatSettings | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="settings"):
            yield Label("Sampling settings", classes="dialog-title")
            with Grid(id="settings-grid"):
                for name, label, hint in FIELDS:
                    yield Label(label)
                    yield Input(str(getattr(self.settings, name)), id=name)
                    yield Label(hint, classes="hint")
            yield Label("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.save()
        else:
            self.action_cancel()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.save()

    def save(self) -> None:
        try:
            values = {name: self.query_one(f"#{name}", Input).value.strip() for name, *_ in FIELDS}
            settings = ChatSettings(
                temperature=float(values["temperature"]),
                top_p=float(values["top_p"]),
                max_tokens=int(values["max_tokens"]),
            )
            settings.validate()
        except (ValueError, LocalInferError) as exc:
            self.query_one("#settings-error", Label).update(f"⚠ {exc}")
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)
