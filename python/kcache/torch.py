"""PyTorch's Mega Cache in kcache: the bytes torch.compiler.save_cache_artifacts()
returns, kept in a slot and handed back to torch.compiler.load_cache_artifacts().

    import kcache.torch
    model = torch.compile(model); model(x)            # compile once
    kcache.torch.save("resnet50", version_key="v3")  # on the build machine
    ...
    kcache.torch.load("resnet50", version_key="v3")  # on a fresh machine, before compiling

A slot is (name, torch version, device, version_key): artifacts of another torch
or another device never load. Each save adds an artifact of kind "megacache" to
the store (and to kcached when $KCACHE_REMOTE is set); load takes the newest one
of the slot, pulling the slot from the server first when there is one.

Importing this module does not import torch; save and load do, and raise
kcache.UnsupportedError naming the torch version when it lacks the Mega Cache
API (torch.compiler.save_cache_artifacts / load_cache_artifacts).
"""

import hashlib
import importlib
import time
from typing import Any, Optional

import kcache
from kcache import _tiers

KIND = "megacache"


def _torch_api(name):
    """torch, and torch.compiler.NAME (raising when this torch lacks it)."""
    torch = importlib.import_module("torch")
    fn = getattr(getattr(torch, "compiler", None), name, None)
    if fn is None:
        raise kcache.UnsupportedError(
            "torch %s (%s) has no torch.compiler.%s: PyTorch's Mega Cache needs a newer torch"
            % (getattr(torch, "__version__", "?"), getattr(torch, "__file__", "?"), name))
    return torch, fn


def default_device(torch) -> str:
    """The device part of a slot when none is given: the name of CUDA device 0
    when torch sees one, else "cpu"."""
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_available():
            return "cuda:" + cuda.get_device_name(0)
    except Exception:  # a broken driver is no reason to fail a cache call
        pass
    return "cpu"


def slot_id(name: str, torch_version: str, device: str, version_key: str) -> str:
    """The device id a slot's artifacts carry in the store, so the ordinary
    device filters (Store.entries, Remote.pull) select one slot."""
    if not name or not version_key:
        raise kcache.InvalidError("a Mega Cache slot needs a name and a version_key")
    text = "kcache-megacache/1\n%s\n%s\n%s\n%s\n" % (name, torch_version, device, version_key)
    return "megacache-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _newest(store, slot):
    entries = store.entries(kind=KIND, device=slot)
    return max(entries, key=lambda e: (e["created"], e["key"])) if entries else None


def save(name: str, *, version_key: str, device: Optional[str] = None, store=None,
         remote=None) -> Optional[str]:
    """Stores the bytes of torch.compiler.save_cache_artifacts() in the slot
    (name, torch version, device, version_key) and returns their key, or None
    when torch had nothing to save. store: a Store or path (default: the
    kcache tool's cache directory); remote: a Remote or URL, False for none
    (default: $KCACHE_REMOTE when set)."""
    torch, fn = _torch_api("save_cache_artifacts")
    st, rm = _tiers.store(store), _tiers.remote(remote)
    saved = fn()
    if saved is None:
        return None
    data = saved[0]
    dev = device or default_device(torch)
    slot = slot_id(name, torch.__version__, dev, version_key)
    # a slot's saves are ordered by "created": keep it increasing, even for two
    # saves in one second, so load always finds the latest
    last = _newest(st, slot)
    created = max(int(time.time()), last["created"] + 1 if last else 0)
    key = hashlib.sha256(("%s\n%s\n" % (slot, hashlib.sha256(data).hexdigest())).encode())
    meta = {"device": slot, "created": created,
            "megacache": {"name": name, "torch": torch.__version__, "device": dev,
                          "version_key": version_key}}
    _tiers.store_and_send(st, rm, data, KIND, key.hexdigest(), meta)
    return key.hexdigest()


def load(name: str, *, version_key: str, device: Optional[str] = None, store=None,
         remote=None) -> Any:
    """Fetches the newest artifacts saved in the slot (name, torch version,
    device, version_key) and hands them to torch.compiler.load_cache_artifacts;
    returns what it returns. Raises kcache.NotFound when the slot is empty
    (after pulling it from the server, when there is one)."""
    torch, fn = _torch_api("load_cache_artifacts")
    st, rm = _tiers.store(store), _tiers.remote(remote)
    dev = device or default_device(torch)
    slot = slot_id(name, torch.__version__, dev, version_key)
    if rm is not None:
        try:
            rm.pull([slot], kind=KIND, store=st)
        except kcache.TrustError:
            raise
        except kcache.Error as e:  # the local store may still have it
            _tiers.log.warning("%s", e)
    newest = _newest(st, slot)
    if newest is None:
        raise kcache.NotFound(
            "no Mega Cache artifacts for %r (torch %s, device %s, version_key %r) in %s%s"
            % (name, torch.__version__, dev, version_key, st.path,
               " or on " + rm.url if rm is not None else ""))
    return fn(bytes(st.get(newest["key"])))
