"""Triton's kernel cache in kcache, through the two hooks Triton reads.

    # every compiled kernel's files in the kcache store (and on kcached when
    # $KCACHE_REMOTE is set), materialised as files where Triton reads them:
    export TRITON_CACHE_MANAGER=kcache.triton:CacheManager

    # or Triton's own RemoteCacheManager with kcached as its remote backend:
    export TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    export TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteCacheBackend

Triton constructs these classes itself (CacheManager(key), with override= or
dump= for its kernel-override and IR-dump directories; RemoteCacheBackend(key)),
so they take their store and server from the kcache tool's environment:
$KCACHE_DIR and $KCACHE_REMOTE, $KCACHE_TOKEN, $KCACHE_TRUSTED_KEYS, ...
Files are kept as artifacts of kind "triton" under a key derived from Triton's
key and the file name; CacheManager writes the files Triton opens under
$KCACHE_TRITON_DIR (default: the cache directory's triton/ folder).

Importing this module does not import Triton: Triton checks its hooks by class
name (a class called CacheManager / RemoteCacheBackend in the class's bases),
which these classes satisfy without Triton's base classes.
"""

import hashlib
import json
import os
import tempfile
from typing import Dict, List, Optional, Union

import kcache
from kcache import _tiers

KIND = "triton"
GROUP_PREFIX = "__grp__"


def artifact_key(triton_key: str, filename: str) -> str:
    """The kcache key of one file of a Triton kernel."""
    text = "kcache-triton/1\n%s\n%s\n" % (triton_key, filename)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_name(what, name):
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise kcache.InvalidError("Triton %s %r is not a plain file name" % (what, name))


def _as_bytes(data):
    return data if isinstance(data, (bytes, bytearray, memoryview)) else str(data).encode()


def _write_atomic(path, data):
    """Writes data to path through a temporary in the same directory, so a
    reader sees the whole file or none."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".kcache-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


class CacheManager:
    """A Triton cache manager (TRITON_CACHE_MANAGER=kcache.triton:CacheManager)
    that keeps every file of a compiled kernel in kcache.

    get_file / get_group return paths of local files, as Triton reads kernels
    from paths: a file found in the store or on the server is written to
    $KCACHE_TRITON_DIR/KEY/ first. put stores the file, sends it to the server
    when $KCACHE_REMOTE is set, and writes the local copy. With override=True
    or dump=True (Triton's TRITON_KERNEL_OVERRIDE / TRITON_KERNEL_DUMP) it is a
    plain directory, as Triton's own manager is there: $TRITON_OVERRIDE_DIR or
    $TRITON_DUMP_DIR, else ~/.triton/override or ~/.triton/dump.
    """

    def __init__(self, key: str, override: bool = False, dump: bool = False, *, store=None,
                 remote=None) -> None:
        _check_name("cache key", key)
        self.key = key
        self._plain = override or dump
        if self._plain:
            var, sub = ("TRITON_DUMP_DIR", "dump") if dump else ("TRITON_OVERRIDE_DIR", "override")
            home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
            base = os.environ.get(var, "").strip() or os.path.join(home, ".triton", sub)
            self.cache_dir = os.path.join(base, key)
            if dump:
                os.makedirs(self.cache_dir, exist_ok=True)
            self._store = self._remote = None
            return
        self._store = _tiers.store(store)
        self._remote = _tiers.remote(remote)
        base = os.environ.get("KCACHE_TRITON_DIR") or os.path.join(self._store.path, "triton")
        self.cache_dir = os.path.join(base, key)
        os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)

    def _path(self, filename):
        _check_name("file name", filename)
        return os.path.join(self.cache_dir, filename)

    def has_file(self, filename: str) -> bool:
        return self.get_file(filename) is not None

    def get_file(self, filename: str) -> Optional[str]:
        """The path of filename for this key, or None when kcache lacks it."""
        path = self._path(filename)
        if os.path.exists(path):
            return path
        if self._plain:
            return None
        key = artifact_key(self.key, filename)
        data = _tiers.fetch(self._store, self._remote, [key]).get(key)
        return None if data is None else _write_atomic(path, data)

    def put(self, data: Union[bytes, str], filename: str, binary: bool = True) -> str:
        """Stores data (bytes, or text for binary=False) as filename; returns
        the local path Triton records in the kernel's group."""
        path = self._path(filename)
        data = _as_bytes(data)
        if not self._plain:
            meta = {"tag": "triton", "triton_key": self.key, "filename": filename}
            _tiers.store_and_send(self._store, self._remote, data, KIND,
                                  artifact_key(self.key, filename), meta)
        os.makedirs(self.cache_dir, exist_ok=True)
        return _write_atomic(path, data)

    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        """{child file name: local path} of the group put_group recorded under
        filename, or None when the group or any of its files is missing (Triton
        then compiles the kernel again)."""
        grp = self.get_file(GROUP_PREFIX + filename)
        if grp is None:
            return None
        with open(grp, "rb") as f:
            try:
                children = json.load(f).get("child_paths")
            except (ValueError, AttributeError):
                return None
        if isinstance(children, dict):  # older Triton wrote {name: path}
            children = list(children)
        if not isinstance(children, list):
            return None
        if not self._plain:  # fetch what is missing in one parallel round
            lacking = [c for c in children if not os.path.exists(self._path(c))]
            keys = {artifact_key(self.key, c): c for c in lacking}
            for k, data in _tiers.fetch(self._store, self._remote, list(keys)).items():
                _write_atomic(self._path(keys[k]), data)
        result = {}
        for child in children:
            path = self._path(child)
            if not os.path.exists(path):
                return None
            result[child] = path
        return result

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        """Records the names of group's files under filename."""
        text = json.dumps({"child_paths": sorted(group)})
        return self.put(text, GROUP_PREFIX + filename, binary=False)


class RemoteCacheBackend:
    """A backend for Triton's RemoteCacheManager
    (TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteCacheBackend): get(filenames)
    -> {filename: bytes} and put(filename, data) on kcached ($KCACHE_REMOTE and
    the tool's credentials), through the local kcache store; without
    $KCACHE_REMOTE, the local store alone. Triton's RemoteCacheManager writes
    the files it gets into its own cache directory."""

    def __init__(self, key: str, *, store=None, remote=None) -> None:
        _check_name("cache key", key)
        self.key = key
        self._store = _tiers.store(store)
        self._remote = _tiers.remote(remote)

    def get(self, filenames: List[str]) -> Dict[str, bytes]:
        keys = {artifact_key(self.key, f): f for f in filenames}
        found = _tiers.fetch(self._store, self._remote, list(keys))
        return {keys[k]: bytes(v) for k, v in found.items()}

    def put(self, filename: str, data: bytes) -> None:
        _check_name("file name", filename)
        meta = {"tag": "triton", "triton_key": self.key, "filename": filename}
        _tiers.store_and_send(self._store, self._remote, _as_bytes(data), KIND,
                              artifact_key(self.key, filename), meta)
