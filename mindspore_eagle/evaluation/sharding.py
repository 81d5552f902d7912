"""Deterministic sharding over workers (``msrun`` ranks or plain processes), shared by ``eval`` and the msrun
generation script.

Worker ``rank`` of ``world`` takes items ``rank, rank + world, rank + 2 * world, ...`` of a list in a stable order
(sorted ids), so the split depends on nothing but the list: 5 items, world 2 -> rank 0 gets 0, 2, 4 and rank 1
gets 1, 3. Rank and world come from explicit arguments, else msrun's ``RANK_ID`` / ``RANK_SIZE``, else a single
worker. msrun also starts every script as its scheduler (``MS_ROLE=MS_SCHED``); our workers share nothing and
never call ``communication.init()``, so that copy has nothing to do (``is_scheduler``) -- otherwise rank 0's
shard would run twice.
"""

from __future__ import annotations

import os
from typing import Sequence, TypeVar

from ..errors import ConfigError

T = TypeVar("T")


def is_scheduler() -> bool:
    """True in msrun's scheduler process, which must exit at once."""
    return os.environ.get("MS_ROLE") == "MS_SCHED"


def resolve_rank(rank: int | None = None, world: int | None = None) -> tuple[int, int]:
    """``(rank, world)`` from the arguments, else ``RANK_ID`` / ``RANK_SIZE``, else ``(0, 1)``; ConfigError when
    they are not integers with ``world >= 1`` and ``0 <= rank < world``."""
    try:
        if world is None:
            world = int(os.environ.get("RANK_SIZE") or 1)
        if rank is None:
            rank = int(os.environ.get("RANK_ID") or 0) if world > 1 else 0
    except ValueError:
        raise ConfigError(f"RANK_ID={os.environ.get('RANK_ID')!r} / RANK_SIZE={os.environ.get('RANK_SIZE')!r}: "
                          "must be integers") from None
    if not (isinstance(world, int) and isinstance(rank, int) and world >= 1 and 0 <= rank < world):
        raise ConfigError(f"rank={rank}, world={world}: need world >= 1 and 0 <= rank < world")
    return rank, world


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """This worker's items: ``items[rank::world]`` (``items`` already in their stable order)."""
    resolve_rank(rank, world)
    return list(items[rank::world])


__all__ = ["is_scheduler", "resolve_rank", "shard"]
