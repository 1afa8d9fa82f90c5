"""Replies shown a frame at a time (ReplyBuffer): nothing lost at the end, on stop or on error,
and the engine never waits for the UI. The real app under its pilot, the real SmolLM2 engine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from localinfer.tui.app import ChatApp  # noqa: E402
from localinfer.tui.session import ChatSession, LoadOptions  # noqa: E402
from localinfer.tui.store import ConversationStore  # noqa: E402
from localinfer.tui.widgets.message_list import MessageView  # noqa: E402
from test_tui_pilot import SIZE, ParkedEngine, make_app, run, send, wait_for  # noqa: E402
from textual.widgets import Markdown  # noqa: E402
from textual.widgets._markdown import MarkdownBlock  # noqa: E402

COUNT = "Count from 1 to 200, one number per line."


@pytest.fixture(scope="module")
def session(smollm2_path: Path):
    s = ChatSession.load(LoadOptions(model=str(smollm2_path)))
    yield s
    s.close()


def reply_text(session: ChatSession, app: ChatApp) -> str:
    """The text of every token the chat took in for the last reply."""
    assert app.chat.reply is not None
    return session.llm.tokenizer.decode(app.chat.reply.token_ids, skip_special=True)


def assert_shown_and_stored(session: ChatSession, app: ChatApp, tmp_path: Path) -> str:
    reply = app.chat.reply
    assert reply is not None and reply.num_shown == len(reply.token_ids) > 0
    text = reply_text(session, app)
    view = app.chat.messages.last("assistant")
    assert isinstance(view, MessageView)
    assert view.content == text and view.markdown.source == text
    assert app.chat.conv.messages[-1].content == text
    assert ConversationStore(tmp_path).load(app.chat.conv.id).messages[-1].content == text
    return text


async def started(pilot, app: ChatApp) -> None:
    """Wait until the first frame of the reply is on screen."""
    await wait_for(pilot, lambda: app.chat.reply is not None and app.chat.reply.num_shown > 0)


def test_full_reply_rendered_and_stored_exactly(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path, max_tokens=80)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "Explain how to make tea, as numbered steps.")
            turn = app.chat.last_turn
            assert turn is not None and turn.finish_reason == "length"
            assert_shown_and_stored(session, app, tmp_path)
            assert turn.num_output_tokens == 80 and turn.visible_tps is not None
            # the frames, appended block by block, render what one full render shows
            view = app.chat.messages.last("assistant")
            assert view is not None
            full = Markdown(view.content)
            await app.chat.messages.mount(full)
            await pilot.pause()
            assert len(blocks(full)) > 3 and blocks(view.markdown) == blocks(full)

    run(body)


def blocks(md: Markdown) -> list[tuple[str, str]]:
    """Each rendered block: its kind and its text with the styles (bold, code) marked."""
    return [(type(b).__name__, b.render().markup) for b in md.query(MarkdownBlock)]


def test_stop_keeps_exactly_the_tokens_taken_in(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path, max_tokens=400)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            before = session.stats().generation_tokens_total
            await pilot.press(*COUNT, "enter")
            await wait_for(pilot, engine.parked.is_set)  # the engine waits before its next step
            await started(pilot, app)
            await pilot.press("escape")
            reply = app.chat.reply
            assert reply is not None
            await wait_for(pilot, lambda: reply.frozen)
            taken = len(reply.token_ids)
            engine.release.set()  # that step still samples a token: the abort comes later
            await wait_for(pilot, lambda: not app.chat.generating, timeout=20)
            assert session.stats().generation_tokens_total - before > taken
            assert len(reply.token_ids) == taken  # ... and the reply does not take it
            assert_shown_and_stored(session, app, tmp_path)
            meta = app.chat.conv.messages[-1].meta
            assert meta["finish_reason"] == "abort"
            assert meta["stats"]["num_output_tokens"] == taken < 400

    with ParkedEngine(session) as engine:  # the 122-token reply waits after a few
        run(body)


def test_engine_finishes_while_the_ui_is_blocked(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path, max_tokens=64)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            before = session.stats().generation_tokens_total
            await pilot.press(*COUNT, "enter")
            await started(pilot, app)
            reply = app.chat.reply
            assert reply is not None
            shown = reply.num_shown
            # the UI's event loop is held here: if handing a token over waited on the UI,
            # the engine would stall and this loop would time out
            deadline = time.monotonic() + 60
            while session.stats().num_running:  # published by the engine thread
                assert time.monotonic() < deadline, "the engine waited on the UI"
                time.sleep(0.01)
            assert session.stats().generation_tokens_total - before == 64
            assert reply.num_shown == shown  # nothing could be shown meanwhile
            await wait_for(pilot, lambda: not app.chat.generating)
            assert len(reply.token_ids) == 64
            assert_shown_and_stored(session, app, tmp_path)

    run(body)


def test_engine_error_keeps_the_text_shown(session, tmp_path: Path) -> None:
    app = make_app(session, tmp_path, max_tokens=200)
    steps = 0

    def hook() -> None:  # on the engine thread, before each step
        nonlocal steps
        steps += 1
        if steps > 8:  # the prefill and a few tokens, then every step fails (counted, not
            raise RuntimeError("injected fault")  # timed: a fast engine ends no sooner)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            session.loop.step_hook = hook
            await pilot.press(*COUNT, "enter")
            await started(pilot, app)
            await wait_for(pilot, lambda: not app.chat.generating, timeout=20)
            assert_shown_and_stored(session, app, tmp_path)
            assert app.chat.conv.messages[-1].meta["finish_reason"] == "error"
            errors = [v.content for v in app.chat.query(MessageView) if v.role == "error"]
            assert errors and "injected fault" in errors[-1]

    try:
        run(body)
    finally:
        session.loop.step_hook = None
