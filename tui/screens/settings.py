"""SettingsScreen: sampling settings of the current chat (temperature, top-k/p, min-p, …).

An empty field takes the model's recommended value (GGUF general.sampling.*), else llama.cpp's;
the hint shows which value that is, so the effective settings are always on screen.
"""

from __future__ import annotations

from localinfer.tui.conversation import SAMPLING, ChatSettings
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from localinfer.errors import LocalInferError
from localinfer.sampling_defaults import SamplingDefaults

FIELDS = (
    ("temperature", "Temperature", "0 = greedy"),
    ("top_k", "Top-k", "0 = off"),
    ("top_p", "Top-p", "nucleus, in (0, 1]"),
    ("min_p", "Min-p", "in [0, 1]"),
    ("repeat_penalty", "Repeat pen.", "1 = off"),
    ("max_tokens", "Max tokens", "longest reply"),
)
INTS = ("top_k", "max_tokens")


class SettingsScreen(ModalScreen[ChatSettings | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings, defaults: SamplingDefaults | None = None) -> None:
        """defaults: the loaded model's (None: no model yet, llama.cpp's)."""
        super().__init__()
        self.settings = settings
        self.defaults = defaults or SamplingDefaults.llama_cpp()

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="settings"):
            yield Label("Sampling settings", classes="dialog-title")
            with Grid(id="settings-grid"):
                for name, label, hint in FIELDS:
                    value = getattr(self.settings, name)
                    placeholder = ""
                    if name in SAMPLING:
                        param = SAMPLING[name]
                        default = self.defaults.values[param]
                        source = "model" if param in self.defaults.from_model else "llama.cpp"
                        placeholder = f"{default:g}"
                        hint += f" · empty = {default:g} ({source})"
                    yield Label(label)
                    yield Input("" if value is None else f"{value:g}", placeholder=placeholder,
                                id=name)
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
            settings = ChatSettings(**{  # type: ignore[arg-type]
                name: None if not text and name in SAMPLING
                else int(text) if name in INTS else float(text)
                for name, text in values.items()})
            settings.validate()
        except (ValueError, LocalInferError) as exc:
            self.query_one("#settings-error", Label).update(f"⚠ {exc}")
            return
        self.dismiss(settings)

    def action_cancel(self) -> None:
        self.dismiss(None)
