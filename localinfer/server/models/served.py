"""ServedModels: which models a server may serve, and what name a request may give each.

Policy:
- With --model options, exactly those (catalog names or .gguf paths; --served-model-name
  renames the first). Without, every catalog model that is pulled, and with --allow-pull every
  catalog model (pulled on first use).
- The default model, for requests without `model`, is the first --model, else the catalog's
  default (if servable), else the first servable one.
- A model answers to its id, its catalog name, its file's name, stem and path, and to those
  with an Ollama-style tag: `:latest`, or the quantization tag of its file (`:q4_1`).
- An unknown name is a 404 that lists the servable ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localinfer.catalog import Catalog, CatalogEntry
from localinfer.server.protocol import APIError

_QUANT = re.compile(r"[._-]((?:i?q\d[\w]*)|f16|f32|bf16)\.gguf$", re.IGNORECASE)


def quant_tag(file_name: str) -> str | None:
    m = _QUANT.search(file_name)
    return m.group(1).lower() if m else None


@dataclass
class ServedModel:
    id: str
    path: Path | None = None  # a .gguf given by path
    entry: CatalogEntry | None = None  # a catalog model (its file may not be pulled yet)
    aliases: set[str] = field(default_factory=set)

    def names(self) -> set[str]:
        names = {self.id, *self.aliases}
        tags = {"latest"}
        file_name = self.path.name if self.path else self.entry.file if self.entry else ""
        if (tag := quant_tag(file_name)) is not None:
            tags.add(tag)
        return names | {f"{n}:{t}" for n in list(names) for t in tags}


class ServedModels:
    def __init__(self, catalog: Catalog, model_args: list[str], served_model_name: str | None,
                 allow_pull: bool, paths: dict[str, Path] | None = None) -> None:
        """`paths`: local paths already resolved for some of model_args (serve pulls named
        catalog models at start)."""
        self.catalog = catalog
        self.allow_pull = allow_pull
        self.fixed: list[ServedModel] = []
        for i, arg in enumerate(model_args):
            model = self._model_for(arg, (paths or {}).get(arg))
            if i == 0 and served_model_name:
                model.aliases.add(model.id)
                model.id = served_model_name
            self.fixed.append(model)

    def _model_for(self, arg: str, path: Path | None) -> ServedModel:
        if arg in self.catalog.entries:
            entry = self.catalog.entries[arg]
            return ServedModel(arg, None, entry, {entry.file})
        file = path or Path(arg).expanduser()
        return ServedModel(file.stem, file, None, {arg, file.name, str(file)})

    def all(self) -> list[ServedModel]:
        if self.fixed:
            return list(self.fixed)
        return [ServedModel(name, None, entry, {entry.file})
                for name, entry in sorted(self.catalog.entries.items())
                if self.allow_pull or self.catalog.path_of(entry).is_file()]

    @property
    def default(self) -> ServedModel | None:
        models = self.all()
        if self.fixed:
            return models[0]
        by_id = {m.id: m for m in models}
        return by_id.get(self.catalog.default) or (models[0] if models else None)

    def resolve(self, name: str | None) -> ServedModel:
        models = self.all()
        if name is None:
            default = self.default
            if default is None:
                raise APIError(404, "no model is pulled: pull one (localinfer pull NAME or "
                               "POST /api/pull) or start the server with --allow-pull",
                               param="model", code="model_not_found")
            return default
        for model in models:
            if name in model.names():
                return model
        ids = ", ".join(repr(m.id) for m in models) or "none"
        raise APIError(404, f"The model '{name}' does not exist; this server serves {ids}",
                       param="model", code="model_not_found")

    def local_path(self, model: ServedModel) -> Path:
        """The model's GGUF file; a catalog model not pulled yet is pulled only with
        --allow-pull (blocking: call it on a worker thread)."""
        if model.path is not None:
            return model.path
        assert model.entry is not None
        target = self.catalog.path_of(model.entry)
        if target.is_file():
            return target
        if not self.allow_pull:
            raise APIError(404, f"the model '{model.id}' is not pulled: run `localinfer pull "
                           f"{model.id}` (or POST /api/pull), or start the server with "
                           "--allow-pull", param="model", code="model_not_found")
        return self.catalog.pull(model.entry.name, progress=False)

    def file_of(self, model: ServedModel) -> Path | None:
        """Its GGUF file if it is on disk, without pulling."""
        if model.path is not None:
            return model.path
        assert model.entry is not None
        target = self.catalog.path_of(model.entry)
        return target if target.is_file() else None

    def describe(self) -> dict[str, Any]:
        return {"models": [m.id for m in self.all()], "allow_pull": self.allow_pull}


def catalog_name(catalog: Catalog, name: str) -> str | None:
    """The catalog entry a (possibly tagged) name means, or None: 'smollm2-135m:latest' and
    'smollm2-135m:q4_1' are 'smollm2-135m'."""
    if name in catalog.entries:
        return name
    base, _, tag = name.rpartition(":")
    entry = catalog.entries.get(base)
    if entry is not None and tag.lower() in {"latest", quant_tag(entry.file)}:
        return base
    return None
