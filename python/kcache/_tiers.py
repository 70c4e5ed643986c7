"""What the adapters share: the Store and Remote a framework hook uses when it
is built by the framework (no arguments), and a fetch that falls back from the
local store to the server and writes server hits back."""

import logging
import os
import threading

import kcache

log = logging.getLogger("kcache")
_lock = threading.Lock()
_shared = {}  # the Store and Remote of each environment seen, by its settings
_REMOTE_VARS = ("KCACHE_REMOTE", "KCACHE_TOKEN", "KCACHE_TOKEN_FILE", "KCACHE_CA_FILE",
                "KCACHE_CLIENT_CERT", "KCACHE_CLIENT_KEY", "KCACHE_TRUSTED_KEYS",
                "KCACHE_SIGN_KEY", "KCACHE_MAX_ARTIFACT")


def store(arg=None):
    """arg (a Store or path) as a Store; None: one Store of the default cache
    directory, shared by every hook of this process."""
    if isinstance(arg, kcache.Store):
        return arg
    if arg is not None:
        return kcache.Store(arg)
    where = ("store", kcache.default_dir(), os.environ.get("KCACHE_TRUSTED_KEYS"),
             os.environ.get("KCACHE_MAX_SIZE"))
    with _lock:
        if where not in _shared:
            _shared[where] = kcache.Store()
        return _shared[where]


def remote(arg=None):
    """arg (a Remote or URL) as a Remote; False: none; None: one Remote from the
    kcache tool's environment ($KCACHE_REMOTE, $KCACHE_TOKEN, ...) when
    $KCACHE_REMOTE is set, shared by every hook of this process, else none."""
    if arg is False:
        return None
    if isinstance(arg, kcache.Remote):
        return arg
    if arg is not None:
        return kcache.Remote(arg)
    if not os.environ.get("KCACHE_REMOTE"):
        return None
    where = ("remote",) + tuple(os.environ.get(v) for v in _REMOTE_VARS)
    with _lock:
        if where not in _shared:
            _shared[where] = kcache.Remote()
        return _shared[where]


def fetch(st, rm, keys):
    """{key: payload} for those of keys found in the store, else on the server
    (fetched in parallel into the store, checked there as the kcache tool
    checks server hits, then read back). A damaged, refused or unreachable copy
    is a miss with a warning on the "kcache" logger: a cache never fails the
    framework's own work."""
    found, lacking = {}, []
    for key in keys:
        try:
            found[key] = st.get(key)
        except kcache.NotFound:
            lacking.append(key)
        except (kcache.CorruptError, kcache.TrustError) as e:
            log.warning("%s", e)
            lacking.append(key)
    if rm is None or not lacking:
        return found
    try:
        fetched = rm.fetch(lacking, store=st)
    except kcache.Error as e:
        log.warning("%s", e)
        return found
    for key in fetched:
        try:
            found[key] = st.get(key)
        except kcache.Error as e:
            log.warning("%s", e)
    return found


def store_and_send(st, rm, data, kind, key, meta):
    """Puts data in the store, then on the server when there is one (a refused
    or failed upload is a warning: the local copy is kept)."""
    st.put(data, kind=kind, key=key, meta=meta)
    if rm is not None:
        try:
            rm.put(data, kind=kind, key=key, meta=meta)
        except kcache.Error as e:
            log.warning("%s", e)
