"""MessageList: the conversation, with assistant replies rendered (and streamed) as Markdown."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Markdown, Static

TITLES = {"user": "You", "assistant": "Assistant", "error": "Error", "info": "Note"}


class MessageView(Vertical):
    """One message: a title line, then the body (Markdown for replies, plain text else)."""

    def __init__(self, role: str, content: str, meta: dict[str, Any] | None = None) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.content = content
        self.meta = meta or {}

    def compose(self) -> ComposeResult:
        yield Label(TITLES.get(self.role, self.role), classes="title")
        if self.role == "assistant":
            yield Markdown(self.content, classes="body")
        else:
            yield Static(self.content, classes="body", markup=False)
        yield Label(self._note(), classes="note")

    def _note(self) -> str:
        reason = self.meta.get("finish_reason")
        if self.meta.get("stopped") or reason == "abort":
            return "stopped"
        if reason == "length":
            return "cut at the token limit"
        if reason == "error":
            return "cut short by an error"
        return ""

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    async def append(self, fragment: str) -> None:
        """Add a frame's text to the reply. Markdown.append re-parses only from the last
        block on, so a frame costs the size of that block, not of the whole reply; awaiting
        it means the widget holds the text when this returns (the caller batches frames, so
        no MarkdownStream queue is needed in between)."""
        self.content += fragment
        await self.markdown.append(fragment)

    async def finish(self, meta: dict[str, Any]) -> None:
        if self.markdown.source != self.content:  # never, unless a frame went missing
            await self.markdown.update(self.content)
        self.meta = meta
        self.query_one(".note", Label).update(self._note())


class MessageList(VerticalScroll):
    def on_mount(self) -> None:
        self.anchor()

    async def add(
        self, role: str, content: str, meta: dict[str, Any] | None = None
    ) -> MessageView:
        view = MessageView(role, content, meta)
        await self.mount(view)
        self.scroll_end(animate=False)
        return view

    async def clear(self) -> None:
        await self.remove_children()

    def last(self, role: str | None = None) -> MessageView | None:
        views = [v for v in self.query(MessageView) if role is None or v.role == role]
        return views[-1] if views else None

    async def remove_after_last_user(self) -> None:
        """Drop the views after the last user message (the reply being regenerated)."""
        views = list(self.query(MessageView))
        users = [i for i, v in enumerate(views) if v.role == "user"]
        cut = users[-1] + 1 if users else 0
        for view in views[cut:]:
            await view.remove()
