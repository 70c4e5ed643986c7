"""kcache: the compilation cache for tensor kernels, from Python.

The C libraries of kcache (the SQLite + zstd store, the kcached client, the
kernel compiler) behind a small API:

    import kcache
    with kcache.Store() as store:          # the cache directory the kcache tool uses
        key = store.put(b"...", kind="blob")
        data = store.get(key)
    remote = kcache.Remote()               # $KCACHE_REMOTE, $KCACHE_TOKEN, ...
    remote.pull()                          # this machine's artifacts into the store
    summary = kcache.compile("model.onnx", device="cpu")

Every error is a kcache.Error (NotFound, AuthError, TrustError, CorruptError,
ServerError, ...) carrying kcache's message. Calls that do I/O release the GIL.
Nothing is printed: the libraries' notes go to logging.getLogger("kcache").

Adapters for the frameworks' own cache hooks live in kcache.triton and
kcache.torch; importing them does not import the framework.
"""

import logging as _logging

from kcache._kcache import (  # noqa: F401  (the public names)
    AuthError,
    CompileError,
    CorruptError,
    Error,
    FullError,
    InvalidError,
    MissError,
    NotFound,
    Remote,
    ServerError,
    StorageError,
    Store,
    TooLargeError,
    TrustError,
    UnsupportedError,
    __version__,
    compile,
    default_dir,
)

# A library's logger stays silent until the application configures logging.
_logging.getLogger("kcache").addHandler(_logging.NullHandler())

__all__ = [
    "AuthError",
    "CompileError",
    "CorruptError",
    "Error",
    "FullError",
    "InvalidError",
    "MissError",
    "NotFound",
    "Remote",
    "ServerError",
    "StorageError",
    "Store",
    "TooLargeError",
    "TrustError",
    "UnsupportedError",
    "compile",
    "default_dir",
]
