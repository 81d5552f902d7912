"""Atomic directory writes: a model or head directory appears complete or not at all, even after ``kill -9``.

Files are written into a temporary sibling directory; only when everything succeeded is it renamed into place
(an existing directory is replaced only at that moment). Any failure removes the temporary directory, so a
failed conversion or export leaves nothing behind and never a half-written file.

A process killed with SIGKILL runs no clean-up, so every temporary name records its writer and its phase, and
the next write to the same OUT (or ``recover(OUT)``) settles what a *dead* writer left:

    .tmp-OUT-<owner>-<rand>       being written       -> removed (it was never complete)
    .tmp-OUT-<owner>-<rand>.new   complete, about to be renamed onto OUT
                                  -> renamed onto OUT when OUT is missing (killed between the two renames of an
                                     overwrite, or before the only one), else removed (OUT was never touched)
    .tmp-OUT-<owner>-<rand>.old   the replaced OUT    -> removed once OUT exists, renamed back if it does not

``<owner>`` is ``<host>-<pid>-<start>``: a hash of the host name, the writer's pid and its start time (clock
ticks since boot, from ``/proc``; 0 where unavailable). A writer is dead only when it ran on this host and its
pid is gone or now belongs to a process started at another time, so a live writer's files -- in this process,
another process, or on another machine sharing the directory -- are never touched. Temporary directories of
older versions (``.tmp-OUT-xxxxxxxx``, no owner) cannot be proven dead and are left alone.

Worked example of an overwrite of ``m`` killed between its two renames, then settled by the next run::

    m/ (old)  .tmp-m-1a2b3c4d-4242-99-0f0f0f0f.new/        writer done, commit begins
    .tmp-m-...-0f0f0f0f.old/  .tmp-m-...-0f0f0f0f.new/     m -> .old; SIGKILL here: no m at all
    m/ (new)  .tmp-m-...-0f0f0f0f.old/                     recover: .new -> m (the writer had committed)
    m/ (new)                                               recover: .old removed
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import zlib
from contextlib import contextmanager
from typing import Iterator, Sequence

from ..errors import EagleError

NEW, OLD = ".new", ".old"


def _start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), 0 when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # The command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def _host_tag() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def owner_tag() -> str:
    """``<host>-<pid>-<start>`` of this process (see the module docstring)."""
    return f"{_host_tag()}-{os.getpid()}-{_start_ticks(os.getpid())}"


_OWNER = r"(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)"


def owner_is_dead(host: str, pid: int, start: int) -> bool:
    """True only when the writer provably no longer runs (this host; pid gone or reused by a later process)."""
    if host != _host_tag():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return start != 0 and _start_ticks(pid) not in (0, start)


def _stale_entries(out_dir: str) -> dict[str, set[str]]:
    """Stem -> phases ("", ".new", ".old") of the temporary names of ``out_dir`` left by dead writers."""
    parent, base = os.path.split(out_dir)
    pattern = re.compile(re.escape(f".tmp-{base}-") + _OWNER + r"-[0-9a-f]{8}(?P<phase>\.new|\.old)?$")
    stale: dict[str, set[str]] = {}
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return stale
    for name in names:
        m = pattern.match(name)
        if m and owner_is_dead(m["host"], int(m["pid"]), int(m["start"])):
            phase = m["phase"] or ""
            stale.setdefault(os.path.join(parent, name[: len(name) - len(phase)]), set()).add(phase)
    return stale


def temp_path(target: str) -> str:
    """A fresh temporary sibling name of ``target`` that records this process as its writer (for a file or a
    directory; ``recover(target)`` removes it once this process is dead)."""
    parent, base = os.path.split(os.path.abspath(target))
    return os.path.join(parent, f".tmp-{base}-{owner_tag()}-{secrets.token_hex(4)}")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def recover(out_dir: str) -> list[str]:
    """Settle the temporary directories of ``out_dir`` left by writers that were killed (module docstring).

    Idempotent and safe to call at any time: a live writer's directories are not touched. Returns one line per
    action taken, for logs and tests.
    """
    out_dir = os.path.abspath(out_dir)
    actions = []
    for stem, phases in sorted(_stale_entries(out_dir).items()):
        if "" in phases:
            _remove(stem)
            actions.append(f"removed unfinished {stem}")
        for phase, installed in ((NEW, "finished the interrupted write of"), (OLD, "restored")):
            if phase in phases:
                if not os.path.lexists(out_dir) and _rename_if_absent(stem + phase, out_dir):
                    actions.append(f"{installed} {out_dir} from {stem + phase}")
                else:
                    _remove(stem + phase)
                    actions.append(f"removed {stem + phase}")
    return actions


def _rename_if_absent(src: str, dst: str) -> bool:
    """``os.replace(src, dst)``; False when another process settling the same leftovers got there first."""
    try:
        os.replace(src, dst)
    except FileNotFoundError:  # src already moved away
        return False
    except OSError:
        if os.path.lexists(dst):  # dst appeared meanwhile (renaming onto a non-empty directory fails)
            return False
        raise
    return True


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def check_output_dir(out_dir: str, overwrite: bool, error: type[EagleError], sources: Sequence[str] = ()) -> str:
    """Refuse, before any expensive work, an output that would destroy its input or an existing directory.

    ``error`` is raised when ``out_dir`` (symlinks resolved) is a source, contains one or lies inside one -- an
    overwrite would delete the source -- or is an existing file, or is a non-empty directory and ``overwrite``
    is false. Interrupted writes of ``out_dir`` are settled first (``recover``), so an overwrite killed between
    its two renames counts as the directory it was installing. Returns ``out_dir`` made absolute.
    """
    absolute = os.path.abspath(out_dir)
    real = os.path.realpath(absolute)
    for src in sources:
        real_src = os.path.realpath(src)
        if real == real_src or _inside(real_src, real) or _inside(real, real_src):
            relation = ("is" if real == real_src else "contains" if _inside(real_src, real) else "lies inside")
            raise error(f"output {out_dir} {relation} the source {src}: writing it would delete or mix with the "
                        "source; choose an output directory outside the source")
    recover(absolute)
    if os.path.lexists(absolute) and not os.path.isdir(absolute):
        raise error(f"output {out_dir} exists and is not a directory; choose another output path")
    if os.path.isdir(absolute) and os.listdir(absolute) and not overwrite:
        raise error(f"{absolute} already exists and is not empty (pass overwrite=True / --overwrite)")
    return absolute


@contextmanager
def atomic_directory(out_dir: str, overwrite: bool, error: type[EagleError],
                     sources: Sequence[str] = ()) -> Iterator[str]:
    """Yield a temporary directory to fill; rename it to ``out_dir`` when the block succeeds.

    ``check_output_dir`` runs first (with ``sources``), so a refused output raises ``error`` before anything
    is written.
    """
    out_dir = check_output_dir(out_dir, overwrite, error, sources)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = temp_path(out_dir)
    os.mkdir(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # the result is an ordinary directory whatever the umask of the temp dir was
        for name in os.listdir(tmp):  # MindSpore writes checkpoints read-only for the owner
            os.chmod(os.path.join(tmp, name), 0o644)
        os.replace(tmp, tmp + NEW)  # the commit point: from here on a killed write is finished by recover()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.lexists(out_dir):
        os.replace(out_dir, tmp + OLD)
        try:
            os.replace(tmp + NEW, out_dir)
        except BaseException:
            os.replace(tmp + OLD, out_dir)  # never leave no OUT behind
            shutil.rmtree(tmp + NEW, ignore_errors=True)
            raise
        shutil.rmtree(tmp + OLD, ignore_errors=True)
    else:
        os.replace(tmp + NEW, out_dir)


def _umask() -> int:
    """The process's umask (read by setting and restoring it: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: str, text: str) -> None:
    """Write a text file atomically (``write_bytes`` of its UTF-8 encoding)."""
    write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str, data: bytes) -> None:
    """Write a file atomically: a temporary sibling, fsynced, then renamed over ``path`` (a reader sees the old file
    or the whole new one, never half of it; a failed write leaves no temporary behind). The file gets the mode an
    ordinary ``open(path, "w")`` would give (0o666 less the umask), not ``mkstemp``'s private 0o600: a committed
    ledger part or a shared result must be readable by the other users of the checkout."""
    import tempfile

    parent = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


__all__ = ["atomic_directory", "check_output_dir", "owner_is_dead", "owner_tag", "recover", "temp_path", "write_bytes",
           "write_text"]
