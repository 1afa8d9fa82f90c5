"""`localinfer chat --plain`: a line REPL for pipes and dumb terminals (no Textual).

Each input line is a user turn; the reply streams to stdout. Lines starting with "/" are
commands (/help). A line ending in a backslash continues on the next line.
"""

from __future__ import annotations

import sys
from typing import TextIO

from localinfer.tui.conversation import SAMPLING, Conversation, Message, describe_settings
from localinfer.tui.session import NEAR_FULL, ChatSession
from localinfer.tui.store import ConversationStore
from localinfer.tui.turn_stats import TurnStats

from localinfer.errors import LocalInferError

HELP = """commands:
  /new              start a new chat          /system TEXT   set the system prompt
  /regen            regenerate the last reply /drop [N]      drop the N oldest turns (1)
  /list             list saved chats          /resume ID     continue a saved chat
  /delete ID        delete a saved chat       /stats         show the last turn's stats
  /set              the sampling settings, and where each comes from
  /set KEY VALUE    temperature, top_k, top_p, min_p, repeat_penalty or max_tokens
                    (VALUE "default": the model's recommended value)
  /quit             leave (also end of input)"""


class PlainChat:
    def __init__(
        self,
        session: ChatSession,
        conv: Conversation,
        store: ConversationStore | None,
        out: TextIO = sys.stdout,
        err: TextIO = sys.stderr,
    ) -> None:
        self.session = session
        self.conv = conv
        self.store = store
        self.out = out
        self.err = err
        self.last: TurnStats | None = None

    def info(self, text: str) -> None:
        print(text, file=self.err, flush=True)

    def run(self, lines: TextIO = sys.stdin) -> int:
        interactive = lines.isatty()
        self.info(f"localinfer chat — {self.session.model_name} "
                  f"(context {self.session.context_limit} tokens). /help for commands.")
        pending = ""
        while True:
            if interactive:
                self.err.write("... " if pending else ">>> ")
                self.err.flush()
            line = lines.readline()
            if not line:
                break
            line = line.rstrip("\n")
            if line.endswith("\\"):
                pending += line[:-1] + "\n"
                continue
            text, pending = (pending + line).strip(), ""
            if not text:
                continue
            if text.startswith("/"):
                if not self.command(text):
                    break
                continue
            self.conv.messages.append(Message("user", text))
            self.reply()
        return 0

    def reply(self) -> None:
        drop = self.session.turns_to_drop(self.conv)
        if drop:
            self.info(f"the context is full ({self.session.context_limit} tokens): "
                      f"/drop {drop} drops the {drop} oldest turn(s), /new starts over")
            self.conv.messages.pop()
            return
        if drop is None:
            self.info("this message alone does not fit the context; not sent")
            self.conv.messages.pop()
            return
        stats = TurnStats()
        text = ""
        params = self.conv.settings.sampling_params(self.session.sampling_defaults)
        handle = self.session.submit(self.session.encode(self.conv), params, aio=False)
        try:
            for out in handle:
                stats.update(out)
                text += out.text
                self.out.write(out.text)
                self.out.flush()
        except KeyboardInterrupt:
            handle.abort()
            stats.finish_reason = "abort"
        except LocalInferError as exc:
            self.info(f"error: {exc}")
            self.conv.messages.pop()
            return
        self.out.write("\n")
        self.out.flush()
        self.last = stats
        meta = {"finish_reason": stats.finish_reason, "stats": stats.to_dict()}
        self.conv.messages.append(Message("assistant", text, meta))
        if stats.context_used >= NEAR_FULL * self.session.context_limit:
            self.info(f"warning: context {stats.context_used}/{self.session.context_limit} "
                      "tokens used")
        self.save()

    def save(self) -> None:
        if self.store is not None and self.conv.messages:
            try:
                self.store.save(self.conv)
            except OSError as exc:
                self.info(f"could not save the chat: {exc}")

    def command(self, text: str) -> bool:
        """Run one /command; False means quit."""
        name, _, arg = text[1:].partition(" ")
        arg = arg.strip()
        try:
            return self._command(name, arg)
        except (LocalInferError, ValueError) as exc:
            self.info(f"error: {exc}")
            return True

    def _command(self, name: str, arg: str) -> bool:
        if name in ("quit", "exit", "q"):
            return False
        if name == "help":
            self.info(HELP)
        elif name == "new":
            self.conv = Conversation(model=self.conv.model, system=self.conv.system,
                                     settings=self.conv.settings)
            self.info("new chat")
        elif name == "system":
            self.conv.system = arg
            self.info("system prompt set" if arg else "system prompt cleared")
        elif name == "set":
            self._set(arg)
        elif name == "regen":
            if self.conv.messages and self.conv.messages[-1].role == "assistant":
                self.conv.messages.pop()
            if self.conv.messages:
                self.reply()
        elif name == "drop":
            n = int(arg) if arg else 1
            self.info(f"dropped {self.conv.drop_oldest_turns(n)} message(s)")
        elif name == "stats":
            self.info(self.last.summary() if self.last else "no reply yet")
        elif name in ("list", "resume", "delete"):
            self._stored(name, arg)
        else:
            self.info(f"unknown command /{name}; /help lists them")
        return True

    def _set(self, arg: str) -> None:
        key, _, value = arg.partition(" ")
        value = value.strip()
        settings = self.conv.settings
        if not key:  # the effective settings, and where each comes from
            self.info(describe_settings(settings, self.session.sampling_defaults))
            return
        if key not in (*SAMPLING, "max_tokens"):
            raise ValueError(f"usage: /set [{'|'.join((*SAMPLING, 'max_tokens'))} VALUE]")
        old = getattr(settings, key)
        if value == "default" and key in SAMPLING:
            setattr(settings, key, None)
        else:
            setattr(settings, key, int(value) if key in ("max_tokens", "top_k") else float(value))
        try:
            settings.validate()
        except LocalInferError:
            setattr(settings, key, old)
            raise
        self.info(describe_settings(settings, self.session.sampling_defaults))

    def _stored(self, name: str, arg: str) -> None:
        if self.store is None:
            raise ValueError("saving is off")
        if name == "list":
            for c in self.store.list():
                self.info(f"{c.id}  {c.when()}  {c.num_messages:3d} msgs  {c.title}")
        elif name == "resume":
            self.conv = self.store.load(arg)
            self.info(f"resumed {arg}: {len(self.conv.messages)} messages")
        elif self.store.delete(arg):
            self.info(f"deleted {arg}")
        else:
            self.info(f"no saved chat {arg}")

