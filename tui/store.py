"""ConversationStore: saved chats as one JSON file each, written atomically."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from localinfer.tui.conversation import Conversation, is_valid_id

from localinfer.atomic_file import atomic_write, remove_stale_temps
from localinfer.errors import InvalidRequestError, LocalInferError


@dataclass(slots=True)
class ConversationInfo:
    id: str
    title: str
    model: str
    num_messages: int
    updated: float

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.updated))


class ConversationStore:
    def __init__(self, root: Path | None = None) -> None:
        if root is None:
            from localinfer import paths

            root = paths.chats_dir()
        self.root = Path(root)

    def path_of(self, conv_id: str) -> Path:
        if not is_valid_id(conv_id):
            raise InvalidRequestError(f"bad conversation id: {conv_id!r}")
        return self.root / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        conv.updated = time.time()
        data = json.dumps(conv.to_dict(), ensure_ascii=False, indent=1).encode("utf-8")
        with atomic_write(self.path_of(conv.id)) as f:
            f.write(data)

    def load(self, conv_id: str) -> Conversation:
        path = self.path_of(conv_id)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InvalidRequestError(f"no saved conversation {conv_id!r}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidRequestError(f"cannot read conversation {conv_id}: {exc}") from exc
        return Conversation.from_dict(data)

    def delete(self, conv_id: str) -> bool:
        try:
            self.path_of(conv_id).unlink()
        except FileNotFoundError:
            return False
        return True

    def list(self) -> list[ConversationInfo]:
        """Saved conversations, most recently updated first; unreadable files are skipped."""
        if not self.root.is_dir():
            return []
        remove_stale_temps(self.root)
        out = []
        for path in self.root.glob("*.json"):
            with contextlib.suppress(LocalInferError):
                conv = self.load(path.stem)
                out.append(
                    ConversationInfo(
                        conv.id, conv.display_title(), conv.model, len(conv.messages),
                        conv.updated,
                    )
                )
        out.sort(key=lambda c: c.updated, reverse=True)
        return out

    def latest(self) -> Conversation | None:
        infos = self.list()
        return self.load(infos[0].id) if infos else None
