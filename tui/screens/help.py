"""HelpScreen: every key, and what the status bar shows."""

from __future__ import annotations

from localinfer.tui.keys import HELP_ROWS
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

STATUS_HELP = (
    "Status bar: time to first token (TTFT), decode speed, context used / limit, KV cache "
    "blocks in use, and the share of the last prompt served from the prefix cache (earlier "
    "turns are not computed again)."
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="help"):
            yield Label("localinfer chat — keys", classes="dialog-title")
            table: DataTable[str] = DataTable(show_cursor=False, zebra_stripes=True)
            table.add_columns("key", "action")
            for key, action in HELP_ROWS:
                table.add_row(key, action)
            yield table
            yield Static(STATUS_HELP, classes="hint")
            yield Label("escape closes", classes="hint")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
