"""The model catalog (models.toml) and the local model cache.

A model is named either by a catalog entry or by a path to a .gguf file; `resolve` turns
either into a local path, pulling a catalog model the first time it is used. With no name, the
default is $LOCALINFER_MODEL, else the catalog's `default`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localinfer import paths
from localinfer.errors import ModelNotFoundError, PullError
from localinfer.progress import ProgressCallback

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CATALOG_FILE = Path(__file__).with_name("models.toml")


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str
    file: str
    sha256: str
    source: dict[str, Any]
    size: int | None = None
    architecture: str = ""
    description: str = ""
    license: str = ""

    @classmethod
    def from_toml(cls, name: str, data: dict[str, Any]) -> CatalogEntry:
        try:
            entry = cls(
                name=name,
                file=str(data["file"]),
                sha256=str(data["sha256"]).lower(),
                source=dict(data["source"]),
                size=data.get("size"),
                architecture=data.get("architecture", ""),
                description=data.get("description", ""),
                license=data.get("license", ""),
            )
        except (KeyError, TypeError) as exc:
            raise PullError(f"catalog entry {name!r} is incomplete: missing {exc}") from exc
        if "/" in entry.file or entry.file.startswith("."):
            raise PullError(f"catalog entry {name!r}: file must be a plain file name")
        return entry


class Catalog:
    def __init__(self, entries: dict[str, CatalogEntry], default: str, models_dir: Path) -> None:
        self.entries = entries
        self.default = default
        self.models_dir = models_dir

    @classmethod
    def load(cls, catalog_file: Path | None = None, models_dir: Path | None = None) -> Catalog:
        with_user = catalog_file is None  # the default catalog includes user-registered models
        catalog_file = catalog_file or CATALOG_FILE
        try:
            data = tomllib.loads(catalog_file.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise PullError(f"cannot read model catalog {catalog_file}: {exc}") from exc
        entries = {
            name: CatalogEntry.from_toml(name, spec)
            for name, spec in data.get("models", {}).items()
        }
        if with_user:  # localinfer quantize --register (user_catalog.py); never shadows ours
            from localinfer.user_catalog import user_entries

            for name, spec in user_entries().items():
                entries.setdefault(name, CatalogEntry.from_toml(name, spec))
        default = data.get("default", next(iter(entries), ""))
        if with_user and os.environ.get("LOCALINFER_MODEL"):
            # the model used when none is named (a bundle's launcher sets its own)
            default = os.environ["LOCALINFER_MODEL"]
        return cls(entries, default, models_dir or paths.models_dir())

    def get(self, name: str) -> CatalogEntry:
        try:
            return self.entries[name]
        except KeyError:
            known = ", ".join(sorted(self.entries)) or "none"
            raise ModelNotFoundError(
                f"unknown model {name!r}: not a catalog name ({known}) nor a .gguf file"
            ) from None

    def path_of(self, entry: CatalogEntry) -> Path:
        return self.models_dir / entry.name / entry.file

    def is_pulled(self, name: str) -> bool:
        return self.path_of(self.get(name)).is_file()

    def resolve(
        self,
        model: str | os.PathLike[str] | None,
        *,
        progress: bool = True,
        on_progress: ProgressCallback | None = None,
    ) -> Path:
        """A local GGUF path for a catalog name or a file path (pulling if needed)."""
        model = os.fspath(model) if model is not None else self.default
        if model in self.entries:
            return self.ensure(model, progress=progress, on_progress=on_progress)
        path = Path(model).expanduser()
        if path.is_file():
            return path
        if path.suffix == ".gguf" or os.sep in model:
            raise ModelNotFoundError(f"model file not found: {model}")
        return self.ensure(model, progress=progress, on_progress=on_progress)

    def ensure(
        self, name: str, *, progress: bool = True, on_progress: ProgressCallback | None = None
    ) -> Path:
        entry = self.get(name)
        target = self.path_of(entry)
        if target.is_file():
            return target
        return self.pull(name, progress=progress, on_progress=on_progress)

    def pull(
        self,
        name: str,
        *,
        progress: bool = True,
        force: bool = False,
        on_progress: ProgressCallback | None = None,
    ) -> Path:
        from localinfer.pull import fetch_to

        entry = self.get(name)
        target = self.path_of(entry)
        if target.is_file() and not force:
            return target
        fetch_to(entry, target, progress=progress, on_progress=on_progress)
        return target

    def remove(self, name: str) -> bool:
        """Delete a pulled model; False when it was not pulled."""
        entry = self.get(name)
        target = self.path_of(entry)
        if not target.exists():
            return False
        from localinfer import weight_cache
        from localinfer.tokenizer import cache as tokenizer_cache

        weight_cache.forget(target)  # its repacked copies go with it
        tokenizer_cache.forget(target)  # and its built tokenizer
        target.unlink()
        with contextlib.suppress(OSError):
            target.parent.rmdir()
        return True

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for name, entry in sorted(self.entries.items()):
            path = self.path_of(entry)
            out.append(
                {
                    "name": name,
                    "default": name == self.default,
                    "pulled": path.is_file(),
                    "size": path.stat().st_size if path.is_file() else entry.size,
                    "architecture": entry.architecture,
                    "description": entry.description,
                    "path": path,
                }
            )
        return out


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
