"""The writers tools/crash_writers.py kills and starves, each as the real CLI (or, for the chat's
saved conversations, which have no CLI, the real ConversationStore API) in a subprocess.

A Case knows how to lay out its inputs (once, outside the disk under test), the old complete
state of its targets inside the disk under test, the command, and how to read and validate a
target: `state(path)` is None when absent, else a digest of what a reader sees, and raises if
the target is there but does not parse (a GGUF must open fully, TOML/JSON must load, an
extracted bundle must pass its own check).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from gguf_factory import write_tiny_llama  # noqa: E402
from hf_dirs import hf_dir_from_f16_gguf  # noqa: E402
from quant_fixtures import write_f16_gguf  # noqa: E402

PY = [sys.executable, "-m", "localinfer"]
NAME = "crash-model"


@dataclass
class Case:
    name: str
    command: Callable[[Path, Path], list[str]]  # (inputs, disk) -> argv
    setup_old: Callable[[Path, Path], None]  # writes the old complete targets into disk
    targets: Callable[[Path], list[Path]]  # the files or folders a reader relies on
    state: Callable[[Path], str | None] = field(default=lambda p: gguf_state(p))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def gguf_state(path: Path) -> str | None:
    """The digest of a GGUF that opens fully (header, metadata, every tensor's extent)."""
    from localinfer.gguf_file import open_gguf

    if not path.exists():
        return None
    with open_gguf(path) as g:
        for name in g.tensors:
            g.raw(name)
    return digest(path.read_bytes())


def toml_state(path: Path) -> str | None:
    import tomllib

    if not path.exists():
        return None
    return digest(json.dumps(tomllib.loads(path.read_text()), sort_keys=True).encode())


def chat_state(path: Path) -> str | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return digest(json.dumps(data["messages"], sort_keys=True).encode())


def tree_state(path: Path) -> str | None:
    """An extracted bundle: absent or empty, else it must pass the bundle's own check."""
    from localinfer.bundle import check

    if not path.exists() or not any(path.iterdir()):
        return None
    root = path / "demo"
    found = check.problems(str(root))
    if found:
        raise ValueError(f"extracted bundle fails its check: {found[0]}")
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(p.relative_to(root).as_posix().encode() + (p.read_bytes() if p.is_file() else b""))
    return h.hexdigest()[:16]


def make_inputs(inputs: Path) -> None:
    """Tiny generated models (~10 MB F32, ~5 MB F16), an HF folder, a bundle archive."""
    from localinfer.bundle import archive, check

    inputs.mkdir(parents=True, exist_ok=True)
    src = write_tiny_llama(inputs / "src32.gguf", n_layers=4, n_embd=256, n_ff=512)
    write_f16_gguf(src, inputs / "src16.gguf")
    hf_dir_from_f16_gguf(inputs / "src16.gguf", inputs / "hf")
    write_tiny_llama(inputs / "old.gguf", n_layers=2, n_embd=128, n_ff=256, seed=1)
    (inputs / "pulled").mkdir(exist_ok=True)
    shutil.copyfile(inputs / "src16.gguf", inputs / "pulled" / "m.gguf")
    bundle = inputs / "bundle"
    (bundle / "models").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(inputs / "src16.gguf", bundle / "models" / "m.gguf")
    (bundle / "README.txt").write_text("crash test bundle\n")
    shutil.copyfile(check.__file__, bundle / "check.py")
    files = {p.relative_to(bundle).as_posix(): {
        "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(bundle.rglob("*")) if p.is_file()}
    models = [{"name": NAME, "file": "models/m.gguf", "sha256": files["models/m.gguf"]["sha256"]}]
    from localinfer.bundle.manifest import FORMAT

    (bundle / check.MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files,
                                                     "models": models}))
    archive.write_archive(bundle, inputs / "bundle.zip", "zip", root_name="demo", progress=False)


def _chat_conv(messages: int, word: str) -> dict:
    return {"id": "c0ffee", "title": "crash", "model": "m", "created": 0.0, "updated": 0.0,
            "messages": [{"role": "user" if i % 2 == 0 else "assistant",
                          "content": f"{word} {i} " * 400} for i in range(messages)]}


CHAT_SCRIPT = """
import json, sys
from pathlib import Path
from localinfer.tui.conversation import Conversation
from localinfer.tui.store import ConversationStore
conv = Conversation.from_dict(json.loads(Path(sys.argv[2]).read_text()))
store = ConversationStore(Path(sys.argv[1]))
for _ in range(int(sys.argv[3])):
    try:
        store.save(conv)
    except OSError as exc:  # what the chat screen shows (tui/screens/chat.py)
        sys.exit(f"localinfer: error: could not save the chat: {exc}")
"""


def _old_out(disk: Path, inputs: Path) -> None:
    (disk / "out").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(inputs / "old.gguf", disk / "out" / "m.gguf")


def _old_register(disk: Path, inputs: Path) -> None:
    """An earlier registration of NAME: its catalog entry and its placed file (the runner
    points LOCALINFER_HOME at disk/home)."""
    from localinfer.user_catalog import register

    _old_out(disk, inputs)
    register(NAME, disk / "out" / "m.gguf")


def _old_pull(disk: Path, inputs: Path) -> None:
    """An old copy of NAME pulled earlier; the catalog entry now names the new file, served by
    the runner at the URL in inputs/pull_url.txt (no size: the disk check cannot fail early)."""
    folder = disk / "home" / "models" / NAME
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(inputs / "old.gguf", folder / "m.gguf")
    sha = hashlib.sha256((inputs / "pulled" / "m.gguf").read_bytes()).hexdigest()
    url = (inputs / "pull_url.txt").read_text().strip()
    (disk / "home" / "user-models.toml").write_text(
        f'[models."{NAME}"]\nfile = "m.gguf"\nsha256 = "{sha}"\n'
        f'source = {{ type = "url", url = "{url}/m.gguf" }}\n')


def _old_chat(disk: Path, inputs: Path) -> None:
    from localinfer.tui.conversation import Conversation
    from localinfer.tui.store import ConversationStore

    (inputs / "chat_new.json").write_text(json.dumps(_chat_conv(60, "new")))
    ConversationStore(disk / "chats").save(Conversation.from_dict(_chat_conv(40, "old")))


def _nothing(disk: Path, inputs: Path) -> None:
    (disk / "out").mkdir(parents=True, exist_ok=True)


def _registered(disk: Path) -> list[Path]:
    return [disk / "out" / "m.gguf", disk / "home" / "models" / NAME / "m.gguf",
            disk / "home" / "user-models.toml"]


def _any_state(path: Path) -> str | None:
    if path.suffix == ".toml":
        return toml_state(path)
    return gguf_state(path)


CASES = [
    Case("quantize", lambda i, d: [*PY, "quantize", str(i / "src32.gguf"),
                                   str(d / "out" / "m.gguf"), "--type", "q8_0", "--no-progress"],
         _old_out, lambda d: [d / "out" / "m.gguf"]),
    Case("convert", lambda i, d: [*PY, "quantize", str(i / "hf"), str(d / "out" / "m.gguf"),
                                  "--type", "f16", "--no-progress"],
         _old_out, lambda d: [d / "out" / "m.gguf"]),
    Case("register", lambda i, d: [*PY, "quantize", str(i / "src32.gguf"),
                                   str(d / "out" / "m.gguf"), "--type", "q8_0", "--no-progress",
                                   "--register", NAME],
         _old_register, _registered, _any_state),
    Case("pull", lambda i, d: [*PY, "pull", NAME, "--force"],
         _old_pull, lambda d: [d / "home" / "models" / NAME / "m.gguf"]),
    Case("bundle-extract", lambda i, d: [*PY, "bundle", "extract", str(i / "bundle.zip"),
                                         str(d / "out" / "x")],
         _nothing, lambda d: [d / "out" / "x"], tree_state),
    # NAME is registered already with another file: the bundle's copy lands as NAME-bundle
    Case("bundle-install", lambda i, d: [*PY, "bundle", "install", str(i / "bundle.zip")],
         _old_register, lambda d: [*_registered(d), d / "home" / "models" / f"{NAME}-bundle" /
                                   "m.gguf"], _any_state),
    Case("chat-save", lambda i, d: [sys.executable, "-c", CHAT_SCRIPT, str(d / "chats"),
                                    str(i / "chat_new.json"), "20"],
         _old_chat, lambda d: [d / "chats" / "c0ffee.json"], chat_state),
]
