"""Which cache entries belong to a model: for ``push`` and ``pull`` of one model's entries.

Given the model object, an entry belongs to it when its module path is one of the model's and
its recorded module structure is that module's (the key's own ingredients). Given only a class
name (the command line), the model's entries are the root entries of that class and every
entry below them: each entry records its children's structure digests, so the walk follows an
entry's children to the entries tuned for them; a level that was never tuned itself is crossed
by its module path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from torch import nn

from . import keys
from .entry import EntryManifest

Selector = Callable[[list[EntryManifest]], list[EntryManifest]]


def for_model(model: nn.Module | str | None) -> Selector:
    """A selector of ``model``'s entries: a module object, a class name, or None for all."""
    if model is None:
        return lambda manifests: list(manifests)
    if isinstance(model, nn.Module):
        wanted = {(path, keys.structure_digest(m)) for path, m in model.named_modules()}
        return lambda manifests: [m for m in manifests if (m.path, keys.digest(m.module)) in wanted]
    return lambda manifests: _by_class(str(model), manifests)


def _class_matches(manifest: EntryManifest, name: str) -> bool:
    qualified = str(manifest.module.get("class", ""))
    return qualified == name or qualified.endswith("." + name)


def _by_class(name: str, manifests: Iterable[EntryManifest]) -> list[EntryManifest]:
    manifests = list(manifests)
    index: dict[tuple[str, str], list[EntryManifest]] = {}
    for m in manifests:
        index.setdefault((m.path, keys.digest(m.module)), []).append(m)
    roots = [m for m in manifests if m.path == "" and _class_matches(m, name)]
    chosen: dict[str, EntryManifest] = {}
    crossed: set[str] = set()
    todo = [("", keys.digest(m.module)) for m in roots]
    seen: set[tuple[str, str]] = set()
    while todo:
        path, digest = todo.pop()
        if (path, digest) in seen:
            continue
        seen.add((path, digest))
        found = index.get((path, digest), [])
        if not found:
            crossed.add(path)
            continue
        for m in found:
            chosen[m.key] = m
            for child, child_digest in m.module.get("children", []):
                if child_digest is not None:
                    todo.append((f"{path}.{child}" if path else str(child), str(child_digest)))
    for m in manifests:
        if any(m.path.startswith(p + ".") for p in crossed):
            chosen.setdefault(m.key, m)
    return sorted(chosen.values(), key=lambda m: (m.path, m.key))
