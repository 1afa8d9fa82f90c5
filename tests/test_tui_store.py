"""Chat conversations and their store: JSON round trip, listing, deleting, dropping turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localinfer.tui.conversation import ChatSettings, Conversation, Message
from localinfer.tui.store import ConversationStore

from localinfer import paths
from localinfer.errors import InvalidRequestError

FIXTURE = Path(__file__).parent / "data" / "chat_fixture.json"


def chat(n_turns: int) -> Conversation:
    conv = Conversation(system="be brief")
    for i in range(n_turns):
        conv.messages += [Message("user", f"q{i}"), Message("assistant", f"a{i}")]
    return conv


def test_round_trip_list_delete(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    a, b = chat(1), chat(2)
    b.id = a.id + "b"
    store.save(a)
    store.save(b)
    assert [c.id for c in store.list()] == [b.id, a.id]  # newest first
    loaded = store.load(a.id)
    assert loaded.prompt_messages() == a.prompt_messages()
    assert store.latest() is not None and store.latest().id == b.id
    assert store.delete(a.id) and not store.delete(a.id)
    assert [c.id for c in store.list()] == [b.id]
    assert not list(tmp_path.glob(".*.part"))  # atomic writes leave no temp files


def test_fixture_loads_and_bad_files_are_skipped(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    data = json.loads(FIXTURE.read_text())
    (tmp_path / f"{data['id']}.json").write_text(json.dumps(data))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "wrongrole.json").write_text(json.dumps({**data, "id": "wrongrole",
                                                         "messages": [{"role": "x", "content": ""}]}))
    assert [c.id for c in store.list()] == [data["id"]]
    with pytest.raises(InvalidRequestError):
        store.load("broken")
    with pytest.raises(InvalidRequestError):
        store.load("../etc/passwd")


def test_drop_oldest_turns() -> None:
    conv = chat(3)
    assert conv.drop_oldest_turns(2) == 4
    assert [m.content for m in conv.messages] == ["q2", "a2"]
    assert conv.prompt_messages()[0] == {"role": "system", "content": "be brief"}


def test_settings_validate() -> None:
    ChatSettings(temperature=0.0, top_p=1.0, max_tokens=1).validate()
    with pytest.raises(InvalidRequestError, match="top_p"):
        ChatSettings(top_p=0.0).validate()


def test_chats_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LOCALINFER_DATA_DIR", raising=False)
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path / "home"))
    assert paths.chats_dir() == tmp_path / "home" / "chats"
    monkeypatch.setenv("LOCALINFER_DATA_DIR", str(tmp_path / "data"))
    assert paths.chats_dir() == tmp_path / "data" / "chats"


def test_plain_repl_does_not_import_textual() -> None:
    import subprocess
    import sys

    code = ("import sys, localinfer.commands.chat, localinfer.tui.plain\n"
            "print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_settings_unset_take_the_models_and_v1_defaults_read_as_unset() -> None:
    """Version 1 always saved its fixed 0.7 / 0.95: they read back as the model's choice;
    a value a user set (0.3) stays."""
    old = {"version": 1, "id": "20261101-120000-abc123",
           "settings": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 64}}
    s = Conversation.from_dict(old).settings
    assert (s.temperature, s.top_p, s.max_tokens) == (None, None, 64)
    old["settings"]["temperature"] = 0.3
    assert Conversation.from_dict(old).settings.temperature == 0.3
    p = ChatSettings(top_k=3).sampling_params()  # no model yet: llama.cpp's for the rest
    assert (p.top_k, p.top_p, p.temperature) == (3, pytest.approx(0.95), pytest.approx(0.8))
    again = Conversation.from_dict(Conversation(settings=ChatSettings(top_k=3)).to_dict())
    assert again.settings == ChatSettings(top_k=3)
