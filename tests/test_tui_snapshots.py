"""Snapshots of the chat app's screens: fixed conversation, fixed size, no model output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pytest_textual_snapshot")

from localinfer.tui.app import ChatApp  # noqa: E402
from localinfer.tui.conversation import Conversation  # noqa: E402
from localinfer.tui.session import LoadOptions  # noqa: E402

from localinfer.engine.outputs import EngineStats  # noqa: E402
from localinfer.sampling_defaults import SamplingDefaults  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "chat_fixture.json"
SIZE = (100, 36)


class FixedSession:
    """Stands in for a loaded model: the screens only read its name, limit and stats."""

    model_name = "smollm2-135m"
    context_limit = 4096
    sampling_defaults = SamplingDefaults.llama_cpp()  # SmolLM2's: its GGUF has no keys

    def encode(self, conv: Conversation) -> list[int]:
        return [0] * 100

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, 512, 16, 0, 0, 0, 0, 0)


def app(conv: Conversation | None = None) -> ChatApp:
    return ChatApp(LoadOptions(), conv or Conversation(), None, session=FixedSession())  # type: ignore[arg-type]


def fixture_conv() -> Conversation:
    return Conversation.from_dict(json.loads(FIXTURE.read_text()))


def test_main_screen_with_a_conversation(snap_compare) -> None:
    assert snap_compare(app(fixture_conv()), terminal_size=SIZE)


def test_main_screen_empty(snap_compare) -> None:
    assert snap_compare(app(), terminal_size=SIZE)


def test_help_screen(snap_compare) -> None:
    assert snap_compare(app(), press=["f1"], terminal_size=SIZE)


def test_settings_screen(snap_compare) -> None:
    assert snap_compare(app(fixture_conv()), press=["f3"], terminal_size=SIZE)
