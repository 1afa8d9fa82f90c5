"""`localinfer chat`: the Textual chat app, or a line REPL with --plain / when piped."""

from __future__ import annotations

import argparse
import os
import sys

from localinfer.commands.backend_flags import add_backend_arguments, backend_options
from localinfer.commands.sampling_flags import add_sampling_arguments
from localinfer.commands.speculative_flags import add_speculative_arguments, speculative_options
from localinfer.errors import InvalidRequestError


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", help="catalog name or path to a .gguf file")
    p.add_argument("--system", default=os.environ.get("LOCALINFER_SYSTEM") or None,
                   help="system prompt for a new chat (default: $LOCALINFER_SYSTEM)")
    add_sampling_arguments(p)
    p.add_argument("--max-tokens", "-n", type=int, help="longest reply in tokens (512)")
    add_backend_arguments(p)
    p.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    p.add_argument("--ctx", type=int, help="context length (default: 4096, at most the model's)")
    p.add_argument("--kv-cache-mb", type=float, help="KV cache budget (default: 2 full contexts)")
    add_speculative_arguments(p)
    p.add_argument("--new", action="store_true", help="start a new chat (default: resume the last)")
    p.add_argument("--resume", metavar="ID", help="resume a saved chat")
    p.add_argument("--list", action="store_true", help="list saved chats and exit")
    p.add_argument("--plain", action="store_true",
                   help="line-based REPL (automatic when stdout is not a terminal)")
    p.add_argument("--no-save", action="store_true", help="do not save this chat")
    p.add_argument("--no-warmup", action="store_true", help=argparse.SUPPRESS)


def main(name: str, args: argparse.Namespace) -> int:
    from localinfer.tui.conversation import Conversation
    from localinfer.tui.session import LoadOptions
    from localinfer.tui.store import ConversationStore

    store = ConversationStore()
    if args.list:
        for c in store.list():
            print(f"{c.id}  {c.when()}  {c.num_messages:3d} msgs  {c.model:<16} {c.title}")
        return 0
    plain = args.plain or not sys.stdout.isatty()
    conv: Conversation | None = None
    if args.resume:
        conv = store.load(args.resume)
    elif not args.new and not plain:
        conv = store.latest()
    if conv is None:
        conv = Conversation()
    _apply(conv, args)
    options = LoadOptions(model=args.model or conv.model or None, backend=args.backend,
                          backend_options=backend_options(args),
                          threads=args.threads, ctx=args.ctx, kv_cache_mb=args.kv_cache_mb,
                          warmup=not args.no_warmup, progress=plain,
                          speculative=speculative_options(args))
    conv.model = options.model or ""
    saving = None if args.no_save else store
    if plain:
        return _plain(options, conv, saving)
    from localinfer.tui.app import ChatApp

    ChatApp(options, conv, saving).run()
    return 0


def _apply(conv: object, args: argparse.Namespace) -> None:
    from localinfer.tui.conversation import Conversation

    assert isinstance(conv, Conversation)
    if args.system is not None:
        conv.system = args.system
    s = conv.settings
    for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty"):
        if getattr(args, name) is not None:  # a flag sets this chat's value; others stay
            setattr(s, name, getattr(args, name))
    if args.max_tokens is not None:
        s.max_tokens = args.max_tokens
    s.validate()
    if args.ctx is not None and args.ctx < 1:
        raise InvalidRequestError(f"invalid --ctx: {args.ctx}")


def _plain(options: object, conv: object, store: object) -> int:
    from localinfer.tui.plain import PlainChat
    from localinfer.tui.session import ChatSession, LoadOptions

    assert isinstance(options, LoadOptions)
    session = ChatSession.load(options)
    try:
        return PlainChat(session, conv, store).run()  # type: ignore[arg-type]
    finally:
        session.close()
