"""ModelPickerScreen: the catalog's models; picking one not yet pulled pulls it first."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


def _size(n: int | None) -> str:
    return f"{n / 1e6:.0f} MB" if n else "?"


class ModelPickerScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, rows: list[dict[str, Any]], current: str) -> None:
        super().__init__()
        self.rows = rows
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="model-picker"):
            yield Label("Switch model", classes="dialog-title")
            options = []
            for row in self.rows:
                mark = "● " if row["name"] == self.current else "  "
                state = "pulled" if row["pulled"] else "will pull"
                label = (f"{mark}{row['name']:<22} {row['architecture']:<8} "
                         f"{_size(row['size']):>7}  {state:<9}  {row['description']}")
                options.append(Option(label, id=row["name"]))
            if not options:
                options.append(Option("the catalog is empty", disabled=True))
            yield OptionList(*options, id="model-list")
            yield Label("enter loads the model · escape closes", classes="hint")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        names = [row["name"] for row in self.rows]
        options.highlighted = names.index(self.current) if self.current in names else 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
