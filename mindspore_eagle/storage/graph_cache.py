"""MindSpore's compile cache, made safe to turn on: one directory per (code, model, compile plan), filled by one
process, in one fixed order, with nothing else compiled while it is on.

Why all of that: MindSpore 2.10 stores the n-th graph a process compiles while the cache is on as
``compile_cache_<n>.mindir`` and hands file n to the n-th compile of a later process; the only check is a hash of
the entry script. Our compile order used to follow the request (the adaptive budget picks tree buckets from
measured times), so a second ``generate`` on one cache directory loaded the 4-row verification graph where it
asked for the 2-row one and failed ("argmax must be integer token ids ... got int32 (2,)", measured here); a
mismatch of two graphs with the same shapes would not even fail. So:

* a **fixed compile plan** (``app.compile_plan``) compiles every graph a request can meet, in one canonical order,
  before any request; the cache is on only for the plan (``MS_COMPILER_CACHE_ENABLE`` is read at every compile,
  and the file counter advances only while it is on) and only when it is the process's first compile;
* the directory is **keyed** by a SHA-256 of this package's sources, the kernel library, MindSpore's version,
  the model's and the head's content fingerprints, the runtime, compute and drafting configs and the plan's step
  labels: any change gives a fresh directory (each holds ~3 MB a graph; the ``KEEP`` most recently used stay);
* **one writer**: an exclusive ``flock`` on ``<dir>.lock`` for the whole plan (loading writes too); a process that
  cannot take it at once compiles without the cache and says so;
* MindSpore's own check, a hash of the entry script and its imports, is pointed at ``compile_entry.py`` for the
  plan: the real entry script may be unreadable to it (``python -c``, ``python -m``: it raises inside the compile);
* **complete or absent**: a ``plan.json`` marker (labels and graphs compiled per step) is written, atomically, only
  after the whole plan ran; a directory without it (an interrupted fill) is removed and filled again, and a load
  whose per-step graph counts differ from the marker's removes the directory and stops with an error instead of
  running on graphs that may be the wrong ones.

MindSpore reads the cache path once per process: a process gets one cache directory, the first it opens.
Measured (Xeon, default teacher and head, 20 graphs): ``generate --mode greedy`` 15.5 s -> 4.4 s in a second
process, same tokens, same decode speed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field

from ..errors import EagleError
from .atomic import write_text

SCHEME = 1  # bump when the layout of a cache directory or the meaning of a key part changes
KEEP = 4  # cache directories kept under one root (least recently used go first): every code change makes a new key
MARKER = "plan.json"
_PROCESS = {"path": None}  # the one cache directory this process used (MindSpore keeps the first path it reads)


def source_digest(package_dir: str | None = None) -> str:
    """SHA-256 over every ``.py`` file of the package (relative path and bytes, sorted): any code change, any
    graph change."""
    root = package_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))  # __pycache__, hidden
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_entry.py")


@contextlib.contextmanager
def _entry_script():
    """MindSpore's entry script set to ``compile_entry.py`` for the body (that module's docstring says why); yields
    why its dependency scan would still fail here, or ""."""
    from mindspore.graph import api

    saved = api.entry_script_path
    api.entry_script_path = ENTRY
    try:
        try:
            api._get_compile_cache_dep_files()  # what MindSpore runs inside every compile with the cache on
            problem = ""
        except Exception as exc:  # anything it raises would be raised inside a compile
            problem = f"MindSpore cannot hash its entry script {ENTRY} ({type(exc).__name__}: {exc})"
        yield problem
    finally:
        api.entry_script_path = saved


def compiled_graphs() -> int:
    """How many graphs this process has compiled so far (MindSpore adds one phase per compile to this set)."""
    from mindspore.graph import api

    return len(api.ms_compile_cache)


@dataclass
class CacheUse:
    """What ``GraphCache.open`` did: ``mode`` "fill" (compiled and stored), "load" (read back), or "off" with
    ``reason``; ``counts`` the graphs each plan step compiled (checked against the marker on a load)."""

    path: str
    mode: str
    reason: str = ""
    counts: list[int] = field(default_factory=list)
    expected: list[int] | None = None

    def step_done(self, label: str, graphs: int) -> None:
        """Record one plan step; on a load, a count unlike the fill's means the files no longer line up with the
        graphs: remove the directory and stop (the graphs loaded so far may be the wrong ones)."""
        self.counts.append(graphs)
        if self.mode == "load" and self.expected is not None:
            i = len(self.counts) - 1
            if i >= len(self.expected) or self.expected[i] != graphs:
                shutil.rmtree(self.path, ignore_errors=True)
                raise EagleError(f"compile cache {self.path}: plan step {label!r} compiled {graphs} graph(s) where "
                                 f"the run that filled it compiled {self.expected[i] if i < len(self.expected) else 0}"
                                 "; the directory was removed, run the command again (it compiles afresh)")


class GraphCache:
    """The cache directory for one compile plan (``key_parts``: anything JSON-serialisable that the graphs depend
    on, the plan's labels among them) under ``root``."""

    def __init__(self, root: str, key_parts: dict, labels: list[str]):
        self.labels = list(labels)
        blob = json.dumps({"scheme": SCHEME, "labels": self.labels, **key_parts}, sort_keys=True, default=repr)
        self.key = hashlib.sha256(blob.encode()).hexdigest()[:24]
        self.path = os.path.join(root, self.key)

    @contextlib.contextmanager
    def open(self):
        """Turn MindSpore's compile cache on for the body (the plan) when it is safe (module docstring); yields a
        ``CacheUse``. The body must call ``use.step_done`` after each plan step."""
        reason = self._unusable()
        if reason:
            yield CacheUse(self.path, "off", reason)
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        lock = open(self.path + ".lock", "a+")
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(lock.fileno()).st_ino != os.stat(self.path + ".lock").st_ino:
                    raise OSError("the lock file was pruned while we opened it")  # another process may hold a new one
            except OSError:
                yield CacheUse(self.path, "off", "another process is filling or reading it")
                return
            with _entry_script() as problem:
                if problem:
                    yield CacheUse(self.path, "off", problem)
                    return
                use = self._prepare()
                _PROCESS["path"] = self.path
                os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
                os.environ["MS_COMPILER_CACHE_PATH"] = self.path
                try:
                    yield use
                finally:
                    os.environ.pop("MS_COMPILER_CACHE_ENABLE", None)  # nothing after the plan is cached (any value
                    # of the variable, even "0", turns the cache on)
            if use.mode == "fill":
                write_text(os.path.join(self.path, MARKER),
                           json.dumps({"labels": self.labels, "counts": use.counts}, indent=1))
        finally:
            lock.close()

    def _unusable(self) -> str:
        if _PROCESS["path"] is not None:
            return f"this process already used {_PROCESS['path']} (MindSpore reads the cache path once per process)"
        if os.environ.get("MS_COMPILER_CACHE_ENABLE"):
            return "MS_COMPILER_CACHE_ENABLE is set outside: the cache is not ours to key"
        if compiled_graphs():
            return "graphs were compiled before the plan: its order would not be the cached one"
        return ""

    def _prepare(self) -> CacheUse:
        marker = os.path.join(self.path, MARKER)
        if os.path.isfile(marker):
            try:
                with open(marker, encoding="utf-8") as f:
                    saved = json.load(f)
                if saved.get("labels") == self.labels and isinstance(saved.get("counts"), list):
                    os.utime(marker)  # recently used: pruned last
                    return CacheUse(self.path, "load", expected=[int(c) for c in saved["counts"]])
            except (OSError, ValueError, TypeError):
                pass
        # no marker (an interrupted fill), or one that does not describe this plan: start the directory afresh
        shutil.rmtree(self.path, ignore_errors=True)
        os.makedirs(self.path)
        prune(os.path.dirname(self.path), KEEP - 1, keep_path=self.path)
        return CacheUse(self.path, "fill")


def prune(root: str, keep: int, keep_path: str = "") -> list[str]:
    """Remove all but the ``keep`` most recently used cache directories under ``root`` (besides ``keep_path``),
    skipping any another process holds; returns the removed paths. The lock file goes with its directory, removed
    while held (a process that opened it a moment before fails its non-blocking lock and runs without the cache)."""
    entries = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if path != keep_path and os.path.isdir(path):
            marker = os.path.join(path, MARKER)
            entries.append((os.path.getmtime(marker if os.path.exists(marker) else path), path))
    removed = []
    for _, path in sorted(entries, reverse=True)[keep:]:
        with open(path + ".lock", "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.remove(path + ".lock")
            removed.append(path)
    return removed


__all__ = ["CacheUse", "GraphCache", "compiled_graphs", "prune", "source_digest"]
