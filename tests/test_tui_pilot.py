"""The chat app driven by Textual's pilot, with the real engine on the real SmolLM2 model."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

pytest.importorskip("textual")

from localinfer.tui.app import ChatApp  # noqa: E402
from localinfer.tui.conversation import ChatSettings, Conversation, Message  # noqa: E402
from localinfer.tui.screens.confirm import ConfirmScreen  # noqa: E402
from localinfer.tui.session import ChatSession, LoadOptions  # noqa: E402
from localinfer.tui.store import ConversationStore  # noqa: E402
from localinfer.tui.widgets.message_list import MessageView  # noqa: E402

SIZE = (120, 40)


@pytest.fixture(scope="module")
def session(smollm2_path: Path):
    s = ChatSession.load(LoadOptions(model=str(smollm2_path)))
    yield s
    s.close()


def make_app(session: ChatSession, tmp_path: Path, conv: Conversation | None = None,
             **settings: float) -> ChatApp:
    conv = conv or Conversation()
    conv.settings = ChatSettings(**{"temperature": 0.0, "max_tokens": 12, **settings})
    return ChatApp(LoadOptions(), conv, ConversationStore(tmp_path), session=session)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())


async def wait_for(pilot, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for the app"
        await pilot.pause(0.05)


async def send(pilot, app: ChatApp, text: str, *keys: str) -> None:
    """Type and send `text` (or press `keys` instead), then wait for the reply to end."""
    done = app.chat.generations
    await pilot.press(*(keys or (*text, "enter")))
    await wait_for(pilot, lambda: app.chat.generations > done)


def views(app: ChatApp) -> list[tuple[str, str]]:
    return [(v.role, v.content) for v in app.chat.query(MessageView)]


class ParkedEngine:
    """While in use, the session's engine parks before its `at`-th step until release is set:
    a test that stops a reply mid-way (on a slow host the whole reply could end before the UI
    saw its first frame and asked to stop) lets the engine wait there by itself."""

    def __init__(self, session: ChatSession, at: int = 4) -> None:
        self.session, self.at, self.steps = session, at, 0
        self.parked, self.release = threading.Event(), threading.Event()

    def _hook(self) -> None:  # on the engine thread, before each step
        self.steps += 1
        if self.steps == self.at:
            self.parked.set()
            self.release.wait(30)

    def __enter__(self) -> ParkedEngine:
        self.session.loop.step_hook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        self.session.loop.step_hook = None
        self.release.set()


def test_streamed_reply_and_prefix_cache_on_second_turn(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path, max_tokens=96)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            seen: list[int] = []  # the reply's length after each streamed piece
            original = MessageView.append

            async def recording_append(view: MessageView, text: str) -> None:
                await original(view, text)
                seen.append(len(view.content))

            MessageView.append = recording_append  # type: ignore[method-assign]
            try:
                await send(pilot, app, "Tell me a long story about a dragon and a knight.")
            finally:
                MessageView.append = original  # type: ignore[method-assign]
            reply = views(app)[-1]
            assert reply[0] == "assistant" and reply[1].strip()
            # the text arrived piece by piece, growing on screen, not in one final update
            assert len(seen) >= 2 and seen == sorted(seen) and seen[0] < seen[-1], seen
            first = app.chat.status.render_text().plain
            assert "TTFT" in first and "tok/s" in first and "KV" in first

            await send(pilot, app, "Tell me more.")
            turn = app.chat.last_turn
            assert turn is not None and turn.num_cached_tokens > 0
            status = app.chat.status.render_text().plain
            hit = status.split("prefix hit ")[1].split("%")[0]
            assert int(hit) > 0, status
            assert f"ctx {turn.context_used}/{session.context_limit}" in status
            saved = ConversationStore(tmp_path).load(app.chat.conv.id)
            assert [m.role for m in saved.messages] == ["user", "assistant"] * 2

    run(body)


def test_stop_mid_generation(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path, max_tokens=400)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press(*"Count from 1 to 200, one number per line.", "enter")
            await wait_for(pilot, engine.parked.is_set)
            await wait_for(pilot, lambda: bool((v := app.chat.messages.last("assistant"))
                                              and v.content))
            await pilot.press("escape")
            engine.release.set()
            await wait_for(pilot, lambda: not app.chat.generating, timeout=10)
            last = app.chat.conv.messages[-1]
            assert last.role == "assistant" and last.meta["finish_reason"] == "abort"
            assert last.meta["stats"]["num_output_tokens"] < 400
            assert "stopped" in str(app.chat.messages.last("assistant").query_one(".note")
                                    .render())
            await wait_for(pilot, lambda: session.stats().kv_blocks_used == 0, timeout=5)

    with ParkedEngine(session) as engine:
        run(body)


def test_regenerate_and_new_chat(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "Name a colour.")
            first_view = app.chat.messages.last("assistant")
            await send(pilot, app, "", "ctrl+r")
            assert [r for r, _ in views(app)] == ["user", "assistant"]
            assert app.chat.messages.last("assistant") is not first_view
            assert [m.role for m in app.chat.conv.messages] == ["user", "assistant"]
            old_id = app.chat.conv.id

            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: app.chat.conv.id != old_id)
            assert views(app) == [] and app.chat.conv.messages == []
            assert [c.id for c in ConversationStore(tmp_path).list()] == [old_id]

    run(body)


def test_resume_saved_chat(session, tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    saved = Conversation(messages=[Message("user", "What is 2+2?"),
                                   Message("assistant", "2+2 is **4**.")])
    store.save(saved)
    app = make_app(session, tmp_path)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f5")
            await pilot.pause()
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.chat.conv.id == saved.id)
            assert views(app) == [("user", "What is 2+2?"), ("assistant", "2+2 is **4**.")]
            await send(pilot, app, "And 3+3?")
            assert len(store.load(saved.id).messages) == 4

    run(body)


def test_change_settings_and_system_prompt(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path, max_tokens=100)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f3")
            await pilot.pause()
            await pilot.click("#max_tokens")
            await pilot.press("ctrl+a", "ctrl+k", *"3", "enter")
            await wait_for(pilot, lambda: app.chat.conv.settings.max_tokens == 3)
            await pilot.press("f2")
            await pilot.pause()
            await pilot.press(*"Answer in French.", "ctrl+s")
            await wait_for(pilot, lambda: app.chat.conv.system == "Answer in French.")
            await send(pilot, app, "Hello")
            assert app.chat.last_turn is not None
            assert app.chat.last_turn.num_output_tokens <= 3
            assert app.chat.conv.prompt_messages()[0]["role"] == "system"

    run(body)


def test_context_overflow_offers_to_drop_oldest_turns(smollm2_path: Path, tmp_path: Path) -> None:
    small = ChatSession.load(LoadOptions(model=str(smollm2_path), ctx=128, warmup=False))
    long = "Tell me about the history of the city and its old bridges. " * 3
    conv = Conversation(messages=[m for i in range(3) for m in
                                  (Message("user", f"{i}: {long}"), Message("assistant", "Ok."))])
    app = make_app(small, tmp_path, conv, max_tokens=4)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press(*"Hi", "enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await send(pilot, app, "", "y")
            roles = [r for r, _ in views(app)]
            assert "info" in roles and roles[-1] == "assistant"
            assert app.chat.conv.num_turns() < 4 and app.chat.conv.messages[-2].content == "Hi"

    try:
        run(body)
    finally:
        small.close()


def test_load_failure_is_a_message_not_a_crash(tmp_path: Path) -> None:
    app = ChatApp(LoadOptions(model=str(tmp_path / "missing.gguf")), Conversation(),
                  ConversationStore(tmp_path))

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: any(r == "error" for r, _ in views(app)), timeout=20)
            assert "model file not found" in views(app)[-1][1]
            await pilot.press(*"hello", "enter")  # no model: a notice, no crash
            await pilot.pause()
            assert app.is_running

    run(body)
