"""Which teacher, data and recipe a training directory belongs to, recorded when the directory is created.

A data directory (``train.data``) holds one teacher's answers under one set of generation settings; a run directory
(``train.trainer``) holds the vocabulary, checkpoints and evaluation history of one head, trained from one teacher on
one data set with one recipe. Both grow across reruns (generation appends shards, the trainer resumes), so a rerun
with another teacher, other data or another recipe used to mix the two silently: a resumed run kept the previous
teacher's lm_head rows and draft vocabulary, a history compared depth-2 and depth-3 scores for "best", a data
directory held two teachers' answers (issue 34).

``claim`` records the identity (a small JSON dict) in ``identity.json`` when the directory is created and refuses a
rerun whose identity differs, naming the differing keys. A directory holding other files but no record (a user's
directory, or one written before identities were recorded) is refused too: nothing proves it is the same run.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

from ..storage.atomic import write_text
from ..errors import IdentityError

IDENTITY_FILE = "identity.json"


def read_identity(directory: str) -> dict | None:
    """The identity recorded in ``directory`` (None when there is no record); IdentityError if it is unreadable."""
    path = os.path.join(directory, IDENTITY_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError) as exc:
        raise IdentityError(f"{path}: unreadable identity record ({exc}); choose another directory") from None
    if not isinstance(record, dict):
        raise IdentityError(f"{path}: the identity record is not a JSON object; choose another directory")
    return record


def mismatch(recorded: dict, identity: dict, keys: Sequence[str] | None = None) -> str:
    """``"key: recorded -> now; ..."`` over ``keys`` (default: all keys of either), "" when they agree."""
    identity = json.loads(json.dumps(identity))  # tuples -> lists, as they read back
    keys = sorted(set(recorded) | set(identity)) if keys is None else keys
    return "; ".join(f"{k}: {recorded.get(k)!r} -> {identity.get(k)!r}" for k in keys
                     if recorded.get(k) != identity.get(k))


def _others(directory: str) -> list[str]:
    """The entries of ``directory`` other than its identity record ([] for a missing directory)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if n != IDENTITY_FILE)


def _unrecorded(directory: str, what: str, remedy: str) -> IdentityError:
    shown = _others(directory)
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    return IdentityError(f"{what} {directory} holds files ({', '.join(shown[:5])}{more}) but no {IDENTITY_FILE}: it "
                         f"was not created by this tool (or by a version that recorded no identity), so adding to it "
                         f"could mix or overwrite them; {remedy}")


def check_claimable(directory: str, what: str, remedy: str, restart: bool = False) -> None:
    """Refuse early (before hours of work that end in ``claim``) a directory that is neither missing, empty nor
    recorded; ``restart`` accepts it (``claim`` then restarts it)."""
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise IdentityError(f"{what} {directory} exists and is not a directory; choose another path")
    if not restart and read_identity(directory) is None and _others(directory):
        raise _unrecorded(directory, what, remedy)


def claim(directory: str, identity: dict, what: str, remedy: str, restart: bool = False,
          owned: Sequence[str] = ()) -> bool:
    """Make ``directory`` the one of ``identity``; True when it already was (resume or append), False when it
    starts now (created, empty, or holding nothing but a record).

    A different record, or other files without one, raises IdentityError naming the differing keys (recorded ->
    now) and ``remedy``; with ``restart`` the files named in ``owned`` (what the caller itself writes there) are
    removed instead and the new identity recorded. Nothing else in the directory is ever deleted."""
    identity = json.loads(json.dumps(identity))  # tuples -> lists, as they read back
    check_claimable(directory, what, remedy, restart)
    recorded = read_identity(directory)
    if recorded == identity:
        return True
    if recorded is not None and _others(directory) and not restart:
        raise IdentityError(f"{what} {directory} records another identity than this command's "
                            f"({mismatch(recorded, identity)}); {remedy}")
    for name in owned:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            os.remove(path)
    os.makedirs(directory, exist_ok=True)
    write_text(os.path.join(directory, IDENTITY_FILE), json.dumps(identity, indent=1, sort_keys=True) + "\n")
    return False


__all__ = ["IDENTITY_FILE", "check_claimable", "claim", "mismatch", "read_identity"]
