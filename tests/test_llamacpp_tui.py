"""`localinfer chat --backend llamacpp`: the Textual app loads SmolLM2 on the llama.cpp backend
itself (as the command does), streams a reply, reuses the first turn's KV on the second turn
(copied between llama.cpp sequences, not recomputed), and frees everything when a reply is
stopped with Escape."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("textual")
pytest.importorskip("llama_cpp")

from localinfer.tui.app import ChatApp  # noqa: E402
from localinfer.tui.conversation import ChatSettings, Conversation  # noqa: E402
from localinfer.tui.session import LoadOptions  # noqa: E402
from localinfer.tui.store import ConversationStore  # noqa: E402
from test_tui_pilot import SIZE, ParkedEngine, send, views, wait_for  # noqa: E402


def test_chat_app_on_the_llamacpp_backend(smollm2_path: Path, tmp_path: Path) -> None:
    conv = Conversation(settings=ChatSettings(temperature=0.0, max_tokens=24))
    options = LoadOptions(model=str(smollm2_path), backend="llamacpp", threads=1, ctx=1024)
    app = ChatApp(options, conv, ConversationStore(tmp_path))

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.session is not None, timeout=120)
            runner = app.session.llm.engine.runner
            assert runner.name == "llamacpp"
            await send(pilot, app, "Name three colors.")
            reply = views(app)[-1]
            assert reply[0] == "assistant" and reply[1].strip()
            assert "tok/s" in app.chat.status.render_text().plain

            copied = runner.prefix_tokens_copied
            await send(pilot, app, "And three animals?")
            turn = app.chat.last_turn
            assert turn is not None and turn.num_cached_tokens > 0
            assert runner.prefix_tokens_copied - copied == turn.num_cached_tokens

            old_id = app.chat.conv.id
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: app.chat.conv.id != old_id)
            app.chat.conv.settings = ChatSettings(temperature=0.0, max_tokens=400)
            # the engine waits before its 4th step until Escape was pressed: unparked, the
            # reply could end before the UI asked to stop (it did once, in CI)
            with ParkedEngine(app.session) as engine:
                await pilot.press(*"Count from 1 to 200, one number per line.", "enter")
                await wait_for(pilot, engine.parked.is_set)
                await wait_for(pilot, lambda: bool((v := app.chat.messages.last("assistant"))
                                                  and v.content))
                await pilot.press("escape")
                engine.release.set()
                await wait_for(pilot, lambda: not app.chat.generating, timeout=10)
            assert app.chat.conv.messages[-1].meta["finish_reason"] == "abort"
            await wait_for(pilot, lambda: app.session.stats().kv_blocks_used == 0, timeout=5)
            assert not runner.kv.live  # llama.cpp's sequence dropped too

    asyncio.run(body())
