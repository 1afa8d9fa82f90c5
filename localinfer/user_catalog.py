"""The user's own catalog entries: models registered with `localinfer quantize --register NAME`.

They live in LOCALINFER_HOME/user-models.toml, in the same table format as models.toml, and
Catalog.load() merges them after the packaged entries (a user entry never shadows one of
those). Registering places the file in the model cache as models/NAME/FILE — a hard link when
the output is on the same file system, else a copy — so `run`, `list` and `rm` treat it like a
pulled model.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localinfer import paths
from localinfer.errors import InvalidRequestError, PullError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from localinfer.catalog import CatalogEntry

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def catalog_path() -> Path:
    return paths.home() / "user-models.toml"


def user_entries() -> dict[str, dict[str, Any]]:
    """name -> table, as in models.toml; {} when the user has registered nothing."""
    path = catalog_path()
    if not path.is_file():
        return {}
    try:
        return dict(tomllib.loads(path.read_text(encoding="utf-8")).get("models", {}))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PullError(f"cannot read the user catalog {path}: {exc}") from exc


def check_name(name: str) -> None:
    from localinfer.catalog import CATALOG_FILE, Catalog

    if not NAME_PATTERN.fullmatch(name):
        raise InvalidRequestError(f"invalid model name {name!r}: use letters, digits, '.', '_' "
                                  "and '-' (at most 64 characters)")
    if name in Catalog.load(CATALOG_FILE).entries:
        raise InvalidRequestError(f"{name!r} is a built-in catalog model; choose another name")


def _toml_value(v: Any) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def _dump(entries: dict[str, dict[str, Any]]) -> str:
    lines = ["# Models added by `localinfer quantize --register` (localinfer edits this)", ""]
    for name, spec in entries.items():
        lines.append(f"[models.{json.dumps(name)}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in spec.items()]
        lines.append("")
    return "\n".join(lines)


def place_file(src: Path, target: Path) -> None:
    """`src` at `target`: a hard link where the file system allows, else a copy; the target
    appears whole or not at all (atomic_file.place_copy)."""
    from localinfer.atomic_file import place_copy

    place_copy(src, target)


def register(name: str, gguf: str | os.PathLike[str], *, source: dict[str, Any] | None = None,
             sha256: str | None = None, license: str = "",
             description: str | None = None) -> CatalogEntry:
    """Add (or replace) the user entry `name` for a GGUF file and place it in the cache.

    `source` says where it came from (default: the local path); `sha256`, when the caller
    has just verified it, saves hashing the file again."""
    from localinfer.atomic_file import atomic_write
    from localinfer.catalog import CatalogEntry, sha256_file
    from localinfer.gguf_file import open_gguf

    check_name(name)
    src = Path(gguf).resolve()
    with open_gguf(src) as g:
        arch = g.arch
    spec: dict[str, Any] = {
        "description": description or f"registered from {src}",
        "architecture": arch,
        "file": src.name,
        "size": src.stat().st_size,
        "sha256": sha256 or sha256_file(src),
        "source": source or {"type": "local", "path": str(src)},
    }
    if license:
        spec["license"] = license
    entry = CatalogEntry.from_toml(name, spec)
    place_file(src, paths.models_dir() / name / src.name)
    entries = user_entries()
    old = entries.pop(name, None)
    if old and old.get("file") != src.name:  # a different file under the same name
        (paths.models_dir() / name / str(old.get("file", ""))).unlink(missing_ok=True)
    entries[name] = spec
    path = catalog_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        f.write(_dump(entries).encode())
    return entry
