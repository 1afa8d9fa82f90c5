"""The chat app's first minute on the real SmolLM2: a compile shows in the status bar (never on
stderr), and the settings screen shows and edits the effective sampling settings."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("textual")

from localinfer.tui.app import ChatApp  # noqa: E402
from localinfer.tui.conversation import Conversation  # noqa: E402
from localinfer.tui.session import ChatSession, LoadOptions  # noqa: E402
from localinfer.tui.widgets.status_bar import StatusBar  # noqa: E402
from textual.widgets import Input, Label, ProgressBar  # noqa: E402

from localinfer import compile_progress  # noqa: E402

SIZE = (120, 40)


@pytest.fixture(scope="module")
def session(smollm2_path: Path):
    s = ChatSession.load(LoadOptions(model=str(smollm2_path), warmup=False))
    yield s
    s.close()


async def wait_for(pilot, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for the app"
        await pilot.pause(0.05)


def test_compile_progress_shows_in_the_status_bar(session: ChatSession, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "compile_seconds.json"
    record.write_text('{"llama/avx2/Q4_1": 4}')
    app = ChatApp(LoadOptions(), Conversation(), None, session=session)
    states: list[str] = []

    def compile_on_the_engine_thread() -> None:  # where a first turn without warm-up compiles
        with compile_progress.CompileProgress("llama/avx2/Q4_1", enabled=True, record=record):
            time.sleep(1.5)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            status = app.chat.query_one(StatusBar)
            bar = app.chat.query_one("#pull-progress", ProgressBar)
            worker = threading.Thread(target=compile_on_the_engine_thread)
            worker.start()
            await wait_for(pilot, lambda: "1 s of ~4 s" in status.state)
            states.append(status.state)
            assert bar.display and bar.progress == 1 and bar.total == 4
            await asyncio.to_thread(worker.join)
            await wait_for(pilot, lambda: status.state == "ready")
            assert not bar.display

    asyncio.run(body())
    assert states[0] == "compiling the kernels for this CPU: 1 s of ~4 s"
    assert capsys.readouterr().err == ""  # the terminal belongs to the app
    assert compile_progress._listener is None  # the app let go when it closed


def test_settings_screen_shows_and_sets_the_sampling(session: ChatSession,
                                                     tmp_path: Path) -> None:
    conv = Conversation()
    app = ChatApp(LoadOptions(), conv, None, session=session)

    async def body() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f3")
            await pilot.pause()
            hints = [str(h.render()) for h in app.screen.query(".hint").results(Label)]
            assert "0 = greedy · empty = 0.8 (llama.cpp)" in hints  # SmolLM2 has no keys
            assert app.screen.query_one("#temperature", Input).value == ""
            await pilot.click("#top_k")
            await pilot.press(*"7", "enter")
            await wait_for(pilot, lambda: conv.settings.top_k == 7)

    asyncio.run(body())
    params = conv.settings.sampling_params(session.sampling_defaults)
    assert (params.top_k, params.temperature, params.min_p) == (7, pytest.approx(0.8),
                                                                pytest.approx(0.05))
