# Type hints of the C extension kcache._kcache (re-exported by kcache).
import os
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence, TypedDict, Union

__version__: str

_Path = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]
_Meta = Union[Mapping[str, Any], str, None]
Buffer = Union[bytes, bytearray, memoryview]  # any object with the buffer protocol

class Error(Exception):
    code: str

class NotFound(Error, LookupError): ...
class InvalidError(Error, ValueError): ...
class AuthError(Error): ...
class TrustError(Error):
    stats: dict[str, Any]  # set when raised by Remote.pull / push

class CorruptError(Error): ...
class ServerError(Error):
    stats: dict[str, Any]

class TooLargeError(Error): ...
class FullError(Error): ...
class StorageError(Error): ...
class CompileError(Error): ...
class MissError(Error): ...
class UnsupportedError(Error): ...

class EntryInfo(TypedDict):
    key: str
    kind: str
    device: str
    tag: str
    size: int
    stored_size: int
    created: int
    atime: int
    origin: str
    sig: str

class StoreStats(TypedDict):
    entries: int
    blobs: int
    logical_bytes: int
    stored_bytes: int
    file_bytes: int
    hits: int
    misses: int
    evictions: int
    corrupt: int
    quarantined: int
    untrusted: int

class PullStats(TypedDict):
    artifacts: int
    imported: int
    present: int
    refused: int
    bytes: int
    seconds: float
    devices: list[str]

class PushStats(TypedDict):
    considered: int
    uploaded: int
    skipped: int
    bytes: int
    seconds: float

class CompileSummary(TypedDict):
    graph: str
    graph_fp: str
    graph_key: str
    device: str
    backend: str
    graph_hit: bool
    kernels: int
    hits: int
    misses: int
    compiled: int
    remote_hits: int
    autotuned: int
    seconds: float

class Store:
    def __init__(
        self,
        path: _Path | None = None,
        *,
        max_size: int | str | None = None,
        trusted_keys: _Path | None = None,
        read_only: bool = False,
    ) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def recovered(self) -> tuple[str, str] | None: ...
    def put(
        self, data: Buffer, *, kind: str = "blob", meta: _Meta = None, key: str | None = None
    ) -> str: ...
    def get(self, key: str) -> bytes | memoryview: ...
    def has(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def keys(
        self,
        *,
        kind: str | None = None,
        device: str | None = None,
        tag: str | None = None,
        since: int | None = None,
    ) -> list[str]: ...
    def entries(
        self,
        *,
        kind: str | None = None,
        device: str | None = None,
        tag: str | None = None,
        since: int | None = None,
    ) -> list[EntryInfo]: ...
    def stats(self) -> StoreStats: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def __contains__(self, key: object) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> "Store": ...
    def __exit__(self, *exc: object) -> Literal[False]: ...

class Remote:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        token_file: _Path | None = None,
        ca_file: _Path | None = None,
        client_cert: _Path | None = None,
        client_key: _Path | None = None,
        trusted_keys: _Path | None = None,
        *,
        sign_key: _Path | None = None,
        timeout_ms: int = 0,
        connect_timeout_ms: int = 0,
        concurrency: int = 0,
    ) -> None: ...
    @property
    def url(self) -> str: ...
    def put(
        self, data: Buffer, *, kind: str = "blob", meta: _Meta = None, key: str | None = None
    ) -> str: ...
    def get(self, key: str) -> bytes | memoryview: ...
    def has(self, key: str) -> bool: ...
    def missing(self, keys: Iterable[str]) -> list[str]: ...
    def fetch(self, keys: Iterable[str], *, store: Store | _Path | None = None) -> list[str]: ...
    def pull(
        self,
        devices: str | Sequence[str] | None = None,
        *,
        store: Store | _Path | None = None,
        kind: str | None = None,
        tag: str | None = None,
        since: int | None = None,
    ) -> PullStats: ...
    def push(
        self,
        *,
        store: Store | _Path | None = None,
        kind: str | None = None,
        device: str | None = None,
        tag: str | None = None,
        since: int | None = None,
    ) -> PushStats: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Remote": ...
    def __exit__(self, *exc: object) -> Literal[False]: ...

def compile(
    graph: _Path,
    *,
    device: str = "cpu",
    target: str | None = None,
    remote: Remote | str | None = None,
    store: Store | _Path | None = None,
    offline: bool = False,
    require_hit: bool = False,
    autotune: bool = False,
    jobs: int = 0,
    shape: Mapping[str, Sequence[int]] | Sequence[str] | None = None,
    tag: str | None = None,
    cflags: str | None = None,
) -> CompileSummary: ...
def default_dir() -> str: ...
