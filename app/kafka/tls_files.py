"""TLS files as a node hands them to OpenSSL: the bytes read once, copied into private
memory files (or a private temporary directory) that OpenSSL opens (`private_copies`), so
that what an `ssl.SSLContext` holds is known by the digests of those very bytes (`held`,
noted by `note_held`), whatever the files hold by the time they are read again. The
clients' context is built so (`app.kafka.connection`), and `app.kafka.tls_reload` loads
into it so: its first check loads nothing the build loaded. Imports nothing of `app`."""

from __future__ import annotations

import contextlib
import hashlib
import os
import ssl
import sys
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence

__all__ = ["digests", "held", "note_held", "private_copies"]

# Anonymous memory files where Linux has them: no copy of a key touches a disk, nor needs
# a writable /tmp (a container's read-only root file system).
_IN_MEMORY = sys.platform == "linux" and os.path.isdir("/proc/self/fd")

# By context: each setting's digest of what it was last loaded with here. Weak: a context
# no client holds any more is forgotten with it.
_HELD: weakref.WeakKeyDictionary[ssl.SSLContext, dict[str, str]] = weakref.WeakKeyDictionary()


def digests(read: Mapping[str, bytes]) -> dict[str, str]:
    """Each setting's digest of the bytes read from its file."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in read.items()}


def held(context: ssl.SSLContext) -> dict[str, str]:
    """What `context` was last loaded with here (`note_held`), by setting; empty when not
    known: every file is taken for changed."""
    return dict(_HELD.get(context, {}))


def note_held(context: ssl.SSLContext, loaded: Mapping[str, str]) -> None:
    """`context` now holds the files of these digests (loaded from copies of those bytes)."""
    _HELD[context] = dict(loaded)


@contextlib.contextmanager
def private_copies(contents: Sequence[bytes | None]) -> Iterator[list[str | None]]:
    """Paths OpenSSL opens holding `contents` (None: none), private to this process and
    gone after: memory files on Linux, else files of a temporary directory (mode 0700)."""
    with contextlib.ExitStack() as stack:
        paths: list[str | None] = []
        directory: str | None = None
        for i, data in enumerate(contents):
            if data is None:
                paths.append(None)
                continue
            if _IN_MEMORY and sys.platform == "linux":
                fd = os.memfd_create("tickwheel-tls", os.MFD_CLOEXEC)
                stack.callback(os.close, fd)
                path = f"/proc/self/fd/{fd}"
            else:
                if directory is None:
                    directory = stack.enter_context(tempfile.TemporaryDirectory())
                path = os.path.join(directory, str(i))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                stack.callback(os.close, fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            paths.append(path)
        yield paths
