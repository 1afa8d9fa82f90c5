"""ChatScreen: the conversation, the input, the status bar; streams replies from the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localinfer.tui.conversation import Conversation, Message
from localinfer.tui.keys import CHAT_BINDINGS
from localinfer.tui.reply_buffer import ReplyBuffer
from localinfer.tui.screens.confirm import ConfirmScreen
from localinfer.tui.session import NEAR_FULL
from localinfer.tui.turn_stats import TurnStats
from localinfer.tui.widgets.chat_input import ChatInput
from localinfer.tui.widgets.message_list import MessageList, MessageView
from localinfer.tui.widgets.status_bar import StatusBar
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Header, ProgressBar
from textual.worker import Worker

from localinfer.errors import LocalInferError

if TYPE_CHECKING:
    from localinfer.tui.app import ChatApp

    from localinfer.engine.engine_loop import RequestHandle


class ChatScreen(Screen[None]):
    BINDINGS = CHAT_BINDINGS
    app: ChatApp

    def __init__(self, conversation: Conversation) -> None:
        super().__init__()
        self.conv = conversation
        self.handle: RequestHandle | None = None
        self.worker: Worker[None] | None = None
        self.last_turn: TurnStats | None = None
        self.reply: ReplyBuffer | None = None  # the reply being (or last) streamed
        self.generations = 0  # finished generate() runs (tests wait on it)
        self.context_used = 0  # tokens of the conversation so far

    def compose(self) -> ComposeResult:
        yield Header()
        yield MessageList(id="messages")
        yield ProgressBar(id="pull-progress", show_eta=False)
        yield ChatInput(id="input", placeholder="Message (enter sends, ctrl+j new line)")
        yield StatusBar(id="status")
        yield Footer()

    @property
    def messages(self) -> MessageList:
        return self.query_one(MessageList)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def generating(self) -> bool:
        return self.worker is not None and self.worker.is_running

    async def on_mount(self) -> None:
        self.query_one(ChatInput).focus()
        await self.show_conversation(self.conv)
        self.set_interval(0.5, self.refresh_engine_stats)

    # -- display -----------------------------------------------------------------------------

    async def show_conversation(self, conv: Conversation) -> None:
        self.conv = conv
        self.sub_title = conv.display_title()
        await self.messages.clear()
        for m in conv.messages:
            await self.messages.add(m.role, m.content, m.meta)
        self.last_turn = None
        self.context_used = 0
        if self.app.session is not None and conv.messages:
            try:
                self.context_used = len(self.app.session.encode(conv))
            except LocalInferError as exc:
                await self.show_error(str(exc))
        self.refresh_status(state="ready" if self.app.session else self.status.state)

    def refresh_status(self, **fields: object) -> None:
        try:
            status = self.status
        except NoMatches:  # not composed yet
            return
        session = self.app.session
        if self.last_turn is not None:
            self.context_used = self.last_turn.context_used
        if session is not None:
            used = self.context_used
            limit = session.context_limit
            near = used >= NEAR_FULL * limit
            fields.setdefault("warning", f"context {used / limit:.0%} full" if near else "")
            fields.update(model=session.model_name, limit=limit, context_used=used,
                          turn=self.last_turn, engine=session.stats())
        status.set(**fields)

    def refresh_engine_stats(self) -> None:
        if self.app.session is not None:
            self.status.set(engine=self.app.session.stats())

    async def show_error(self, text: str) -> None:
        await self.messages.add("error", text)

    def save(self, conv: Conversation) -> None:
        store = self.app.store
        if store is None or not conv.messages:
            return
        try:
            store.save(conv)
        except OSError as exc:
            self.notify(f"could not save the chat: {exc}", severity="error")

    # -- sending and generating ----------------------------------------------------------------

    async def on_chat_input_submitted(self, event: ChatInput.Submitted) -> None:
        await self.send(event.text)

    async def action_send(self) -> None:
        text = self.query_one(ChatInput).text.strip()
        if text:
            await self.send(text)

    def action_newline(self) -> None:
        box = self.query_one(ChatInput)
        box.focus()
        box.insert("\n")

    async def send(self, text: str) -> None:
        if self.app.session is None:
            self.notify("the model is not loaded yet", severity="warning")
            return
        if self.generating:
            self.notify("still generating — escape stops it", severity="warning")
            return
        self.query_one(ChatInput).clear()
        self.conv.messages.append(Message("user", text))
        self.sub_title = self.conv.display_title()
        await self.messages.add("user", text)
        self.start_generation()

    def start_generation(self) -> None:
        self.worker = self.run_worker(self.generate(), group="generate", exit_on_error=False)

    async def generate(self) -> None:
        try:
            if await self.make_room():
                await self.stream_reply(self.conv)
        except LocalInferError as exc:
            await self.show_error(str(exc))
        except Exception as exc:  # never a traceback on the terminal
            await self.show_error(f"unexpected error: {type(exc).__name__}: {exc}")
        finally:
            self.handle = None
            self.generations += 1
            self.refresh_status(state="ready")

    async def make_room(self) -> bool:
        """On overflow, offer to drop the oldest turns; False leaves the message unsent."""
        session = self.app.session
        assert session is not None
        drop = session.turns_to_drop(self.conv)
        if drop == 0:
            return True
        limit = session.context_limit
        if drop is not None:
            question = (f"This chat no longer fits the context ({limit} tokens, with room for "
                        f"the reply). Drop the {drop} oldest turn(s) and send?")
            if await self.app.push_screen_wait(ConfirmScreen("Context full", question)):
                self.conv.drop_oldest_turns(drop)
                await self.show_conversation(self.conv)
                await self.messages.add("info", f"dropped the {drop} oldest turn(s) to fit")
                return True
        user = self.conv.messages.pop()
        await self.show_conversation(self.conv)
        self.query_one(ChatInput).load_text(user.content)
        why = "does not fit the context" if drop is None else "was not sent: the context is full"
        await self.show_error(f"Your message {why} ({limit} tokens). Start a new chat "
                              "(ctrl+n), or shorten the message.")
        self.refresh_status(warning="context full")
        return False

    async def stream_reply(self, conv: Conversation) -> None:
        session = self.app.session
        assert session is not None
        ids = session.encode(conv)
        params = conv.settings.sampling_params(session.sampling_defaults)
        self.handle = handle = session.submit(ids, params, aio=True, paced=True)
        view = await self.messages.add("assistant", "")
        self.last_turn = stats = TurnStats()
        stats.num_prompt_tokens = len(ids)
        self.reply = reply = ReplyBuffer()
        self.refresh_status(state="generating…")
        try:
            # the engine thread never waits on the UI, nor wakes it for every token: the UI
            # takes in what has come when its next frame is due (engine_loop.py) and shows it
            while (outs := await handle.batch(reply.wake_at())) is not None:
                for out in outs:
                    if reply.add(out):
                        stats.update(out)
                if reply.due():
                    await self.show_frame(view, reply)
        except LocalInferError:  # the engine failed: keep what came, then say so
            if not reply.token_ids:
                await view.remove()
                raise
            await self.show_frame(view, reply)
            stats.finish_reason = "error"
            await self.end_reply(conv, view, stats, reply)
            raise
        except BaseException:
            if not handle.finished:
                handle.abort()
            await view.remove()
            raise
        await self.show_frame(view, reply)
        if reply.frozen:  # stopped: whatever the engine said last, the reply ends here
            stats.finish_reason = "abort"
        await self.end_reply(conv, view, stats, reply)

    async def show_frame(self, view: MessageView, reply: ReplyBuffer) -> None:
        if reply.pending:
            await view.append(reply.take())
            reply.shown()
            self.refresh_status(state="stopping…" if reply.frozen else "generating…")

    async def end_reply(self, conv: Conversation, view: MessageView, stats: TurnStats,
                        reply: ReplyBuffer) -> None:
        stats.visible_tps = reply.visible_tps
        meta = {"finish_reason": stats.finish_reason, "stats": stats.to_dict()}
        await view.finish(meta)
        conv.messages.append(Message("assistant", view.content, meta))
        self.save(conv)

    async def wait_idle(self) -> None:
        """Stop any reply in progress and wait until it has ended."""
        if self.handle is not None:
            self.handle.abort()
        if self.worker is not None:
            await self.worker.wait()

    # -- actions -------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.handle is not None:
            if self.reply is not None:
                self.reply.freeze()  # the reply keeps what was taken in, nothing later
            self.handle.abort()
            self.refresh_status(state="stopping…")

    async def action_regenerate(self) -> None:
        if self.generating or self.app.session is None:
            self.notify("wait for the current reply (escape stops it)", severity="warning")
            return
        while self.conv.messages and self.conv.messages[-1].role == "assistant":
            self.conv.messages.pop()
        if not self.conv.messages:
            self.notify("nothing to regenerate yet")
            return
        await self.messages.remove_after_last_user()
        self.start_generation()

    async def action_new_chat(self) -> None:
        await self.wait_idle()
        old = self.conv
        await self.show_conversation(
            Conversation(model=old.model, system=old.system, settings=old.settings)
        )
        self.query_one(ChatInput).focus()

    async def resume(self, conv_id: str) -> None:
        await self.wait_idle()
        assert self.app.store is not None
        try:
            conv = self.app.store.load(conv_id)
        except LocalInferError as exc:
            await self.show_error(str(exc))
            return
        await self.show_conversation(conv)

    def action_help(self) -> None:
        self.app.action_help()

    def action_system_prompt(self) -> None:
        self.app.action_system_prompt()

    def action_settings(self) -> None:
        self.app.action_settings()

    def action_pick_model(self) -> None:
        self.app.action_pick_model()

    def action_conversations(self) -> None:
        self.app.action_conversations()
