"""Helpers for the remote-tier tests: tune the fake tree through a cache, read the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import tunetree as tt
from tunetree.cache.remote import LAYOUT
from tunetree.cache.s3 import S3Location

from . import fakes

DATA = [torch.randn(4, 8, generator=torch.Generator().manual_seed(1))]


def tune_tree(
    cache: tt.TuningCache, depths: tuple[int, ...] = (0, 1, 2), seed: int = 0
) -> dict[str, Any]:
    """Tune :func:`fakes.tree` at ``depths`` through ``cache``; builds, hits, outputs vs eager."""
    model = fakes.tree(seed)
    fakes.name_modules(model)
    fakes.BUILDS.clear()
    with torch.no_grad():
        expected = [model(x) for x in DATA]
    ok = True
    for depth in depths:
        result = tt.tune(
            model,
            DATA,
            depth=depth,
            strategy=fakes.strategy("first-wins"),
            measure_config=tt.MeasureConfig.quick(),
            verbose=False,
            cache=cache,
        )
        with torch.no_grad():
            ok = ok and all(
                torch.equal(result.model(x), y) for x, y in zip(DATA, expected, strict=True)
            )
        result.undo()
    return {
        "builds": list(fakes.BUILDS),
        "hits": cache.stats.hits,
        "remote_hits": cache.stats.remote_hits,
        "remote_stored": cache.stats.remote_stored,
        "ok": ok,
    }


def objects(server: Any, url: str, folder: str) -> dict[str, bytes]:
    """Every object under ``url``'s ``v1/<folder>/``: name below it -> bytes."""
    location = S3Location.parse(url)
    client = server.client()
    start = location.name(LAYOUT, folder) + "/"
    listed = client.list_objects_v2(Bucket=location.bucket, Prefix=start).get("Contents", [])
    return {
        item["Key"][len(start) :]: client.get_object(Bucket=location.bucket, Key=item["Key"])[
            "Body"
        ].read()
        for item in listed
    }


def put(server: Any, url: str, folder: str, name: str, data: bytes) -> None:
    """Overwrite an object on the server (what a hostile or broken writer does)."""
    location = S3Location.parse(url)
    server.client().put_object(
        Bucket=location.bucket, Key=location.name(LAYOUT, folder, name), Body=data
    )


def new_cache(tmp: Path, name: str, url: str, **options: Any) -> tt.TuningCache:
    return tt.TuningCache(tmp / name, remote=url, **options)
