"""ConversationsScreen: saved chats, newest first — enter resumes, d deletes."""

from __future__ import annotations

from localinfer.tui.store import ConversationStore
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option


class ConversationsScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("d,delete", "delete", "Delete"),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, store: ConversationStore, current_id: str = "") -> None:
        super().__init__()
        self.store = store
        self.current_id = current_id

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="conversations"):
            yield Label("Saved chats", classes="dialog-title")
            yield OptionList(id="conversation-list")
            yield Label("enter resumes · d deletes · escape closes", classes="hint")

    def on_mount(self) -> None:
        self.refresh_list()
        self.query_one(OptionList).focus()

    def refresh_list(self) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        infos = self.store.list()
        for info in infos:
            mark = "● " if info.id == self.current_id else "  "
            label = f"{mark}{info.when()}  {info.num_messages:3d} msgs  {info.title}"
            options.add_option(Option(label, id=info.id))
        if not infos:
            options.add_option(Option("no saved chats yet", id="", disabled=True))
        else:
            options.highlighted = 0

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.dismiss(event.option.id)

    def action_delete(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return
        option = options.get_option_at_index(options.highlighted)
        if option.id:
            self.store.delete(option.id)
            self.notify(f"deleted chat {option.id}")
            self.refresh_list()

    def action_cancel(self) -> None:
        self.dismiss(None)
