"""ChatApp: `localinfer chat` — a Textual chat that shows the engine at work.

The model loads (and, from the catalog, pulls) on a worker thread; the engine steps on its
own thread (EngineLoop); the UI only awaits streamed outputs, so it never blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from localinfer.tui.conversation import ChatSettings, Conversation, describe_settings
from localinfer.tui.screens.chat import ChatScreen
from localinfer.tui.screens.conversations import ConversationsScreen
from localinfer.tui.screens.help import HelpScreen
from localinfer.tui.screens.model_picker import ModelPickerScreen
from localinfer.tui.screens.settings import SettingsScreen
from localinfer.tui.screens.system_prompt import SystemPromptScreen
from localinfer.tui.session import ChatSession, LoadOptions
from localinfer.tui.store import ConversationStore
from textual.app import App
from textual.widgets import ProgressBar

from localinfer import compile_progress
from localinfer.errors import LocalInferError


class ChatApp(App[None]):
    CSS_PATH = "chat.tcss"
    TITLE = "localinfer chat"
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        options: LoadOptions,
        conversation: Conversation | None = None,
        store: ConversationStore | None = None,
        session: ChatSession | None = None,
    ) -> None:
        """`session`: an already loaded model (tests); the app then neither loads nor closes
        it. Otherwise the model named in `options` loads when the app starts."""
        super().__init__()
        self.options = options
        self.store = store
        self.session = session
        self._owns_session = session is None
        self.chat = ChatScreen(conversation or Conversation(model=options.model or ""))

    async def on_mount(self) -> None:
        await self.push_screen(self.chat)
        # a first compile shows in the status bar (on stderr it would tear the screen)
        compile_progress.report_to(self._compile_progress)
        if self.session is None:
            self.load_model(self.options.model)

    async def on_unmount(self) -> None:
        compile_progress.report_to(None)
        if self.chat.handle is not None:
            self.chat.handle.abort()
        if self._owns_session and self.session is not None:
            self.session.close()
            self.session = None

    # -- loading models ------------------------------------------------------------------------

    def load_model(self, model: str | None) -> None:
        label = Path(model).stem if model else "the default model"
        self.chat.refresh_status(state=f"loading {label}…")
        options = dataclasses.replace(self.options, model=model)
        self.run_worker(lambda: self._load(options), thread=True, group="load",
                        exit_on_error=False)

    def _load(self, options: LoadOptions) -> None:  # on a worker thread
        def progress(label: str, done: int, total: int | None) -> None:
            self.call_from_thread(self._show_progress, label, done, total)

        try:
            session = ChatSession.load(options, on_progress=progress)
        except (LocalInferError, OSError) as exc:
            self.call_from_thread(self._load_failed, options.model, str(exc))
        except Exception as exc:  # never a traceback on the terminal
            self.call_from_thread(self._load_failed, options.model,
                                  f"{type(exc).__name__}: {exc}")
        else:
            self.call_from_thread(self._loaded, session, options)

    def _show_progress(self, label: str, done: int, total: int | None) -> None:
        bar = self.chat.query_one("#pull-progress", ProgressBar)
        bar.display = True
        bar.update(total=total, progress=done)
        self.chat.refresh_status(state=label)

    def _compile_progress(self, label: str, done: int, total: int | None) -> None:
        # on the thread that steps the model (the loader's warm-up, or the engine loop); a
        # compile still running when the app has quit has no one left to tell
        with contextlib.suppress(RuntimeError):
            self.call_from_thread(self._show_compile, label, done, total or 0)

    def _show_compile(self, label: str, elapsed: int, expected: int) -> None:
        if elapsed < expected:
            self._show_progress(f"{label}: {elapsed} s of ~{expected} s", elapsed, expected)
            return
        self.chat.query_one("#pull-progress", ProgressBar).display = False
        self.chat.refresh_status(state="loading…" if self.session is None else "ready")

    async def _loaded(self, session: ChatSession, options: LoadOptions) -> None:
        await self.chat.wait_idle()
        old, self.session, self._owns_session = self.session, session, True
        self.options = options
        self.chat.conv.model = options.model or session.model_name
        self.chat.query_one("#pull-progress", ProgressBar).display = False
        self.chat.refresh_status(state="ready")
        if old is not None:
            old.close()

    async def _load_failed(self, model: str | None, message: str) -> None:
        self.chat.query_one("#pull-progress", ProgressBar).display = False
        state = "ready" if self.session is not None else "no model"
        self.chat.refresh_status(state=state)
        await self.chat.show_error(f"Could not load {model or 'the default model'}: {message}"
                                   "\nPick another model with f4.")

    # -- dialogs -------------------------------------------------------------------------------

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_system_prompt(self) -> None:
        def done(text: str | None) -> None:
            if text is not None:
                self.chat.conv.system = text
                self.chat.save(self.chat.conv)
                self.notify("system prompt cleared" if not text else "system prompt set")

        self.push_screen(SystemPromptScreen(self.chat.conv.system), done)

    def action_settings(self) -> None:
        def done(settings: ChatSettings | None) -> None:
            if settings is not None:
                self.chat.conv.settings = settings
                self.chat.save(self.chat.conv)
                defaults = self.session.sampling_defaults if self.session else None
                self.notify(describe_settings(settings, defaults))

        defaults = self.session.sampling_defaults if self.session else None
        self.push_screen(SettingsScreen(self.chat.conv.settings, defaults), done)

    def action_conversations(self) -> None:
        if self.store is None:
            self.notify("saving chats is off", severity="warning")
            return

        async def done(conv_id: str | None) -> None:
            if conv_id:
                await self.chat.resume(conv_id)

        self.push_screen(ConversationsScreen(self.store, self.chat.conv.id), done)

    def action_pick_model(self) -> None:
        try:
            from localinfer.catalog import Catalog

            rows = Catalog.load().rows()
        except LocalInferError as exc:
            self.notify(str(exc), severity="error")
            return
        current = self.session.model_name if self.session else ""

        def done(name: str | None) -> None:
            if name and name != current:
                self.load_model(name)

        self.push_screen(ModelPickerScreen(rows, current), done)
