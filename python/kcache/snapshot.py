"""kcache.snapshot: a framework's cache directory as a snapshot, from Python.

The same workflow and rules as ``kcache dir`` (docs/GUIDE.md section 9), over the
same C library, with the GIL released while it runs::

    import kcache.snapshot as snap
    snap.push("/home/me/.triton/cache", "triton", "triton=3.3.0",
              device_key="h100-cuda12.4", remote="http://buildhost:7070")
    snap.pull("triton", None, "triton=3.3.0", device_key="h100-cuda12.4")

A snapshot is keyed by its name, a device key (default: this machine's CPU
fingerprint id, as the tool) and a version key. A name that is a preset's
(triton, inductor, vllm, jax, neo), or ``preset=``, picks the framework's own
directory when ``dir`` is None and leaves its lock and temporary files alone.

``store`` is a kcache.Store or a path (default: the default cache directory;
its trusted keys, or $KCACHE_TRUSTED_KEYS, decide which manifests count);
``remote`` a kcache.Remote or URL (default: $KCACHE_REMOTE; None and no
variable: this machine only).

Trust rules, as the tool's: a directory another user owns or can write, or
another user's symlink in its place, raises kcache.TrustError before anything
is read or written (``trust_shared_dir=True`` for a team's shared directory);
restored modes are masked by the umask and never give group/other write
(``allow_shared_write=True`` lets the manifest's through); a manifest counts
only for the name, device and version its own signed bytes name.

Every function returns a dict (the fields of ``kcache --json dir ...``) and
raises a kcache.Error: NotFound (no snapshot), TrustError, InvalidError (a bad
name, key or preset), ServerError, AuthError, FullError, CorruptError.
"""

from kcache import _kcache


def push(dir, name, version_key, device_key=None, preset=None, remote=None, store=None,
         trust_shared_dir=False, recheck=False):
    """Scans dir (None: the preset's directory) into the store and uploads what the
    server lacks, the manifest last. An unchanged directory asks the server about its
    manifest's key alone (``unchanged`` True); ``recheck=True`` asks about every file.
    Returns name, device_key, version_key, snapshot, manifest, manifest_sent,
    unchanged, dir, files, dirs, bytes, excluded, special, files_sent,
    files_skipped, bytes_sent."""
    return _kcache.snapshot_push(dir, name, version_key, device_key=device_key,
                                 preset=preset, remote=remote, store=store,
                                 trust_shared_dir=trust_shared_dir, recheck=recheck)


def pull(name, dir, version_key, device_key=None, preset=None, remote=None, store=None,
         exact=False, verify=False, trust_shared_dir=False, allow_shared_write=False):
    """Restores the newest trusted snapshot into dir (None: the preset's directory;
    created 0700 when missing): each file written atomically, only what dir lacks
    fetched. ``exact`` removes what the snapshot lacks (below dir only), ``verify``
    re-reads every file (MissError when any is missing or different). Returns name,
    device_key, version_key, snapshot, manifest, dir, files, bytes, files_received,
    bytes_received, written, unchanged, removed, bytes_written, missing."""
    return _kcache.snapshot_pull(name, dir, version_key, device_key=device_key,
                                 preset=preset, remote=remote, store=store, exact=exact,
                                 verify=verify, trust_shared_dir=trust_shared_dir,
                                 allow_shared_write=allow_shared_write)


def status(name, dir, version_key, device_key=None, preset=None, store=None,
           trust_shared_dir=False):
    """Compares dir with the snapshot last pushed or pulled here (the server is not
    asked). Returns ok, manifest, dir, files, bytes, missing (files missing or
    different) with the key words; NotFound when the store has no such snapshot."""
    return _kcache.snapshot_status(name, dir, version_key, device_key=device_key,
                                   preset=preset, store=store,
                                   trust_shared_dir=trust_shared_dir)


def explain(name, version_key, device_key=None, preset=None, remote=None, store=None):
    """Whether the snapshot exists (asking the server when there is one): found,
    manifest, files, bytes, refused (manifests no trusted key signed) and, when not
    found, nearest: the device and version keys that exist for the name and what
    differs from the ones asked for."""
    return _kcache.snapshot_explain(name, version_key, device_key=device_key, preset=preset,
                                    remote=remote, store=store)


__all__ = ["explain", "pull", "push", "status"]
