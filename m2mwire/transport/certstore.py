"""Where a TLS server's certificate comes from (wss://, quic://): the user's own (``certfile=``,
``ssl=``), or a self-signed one we generate and keep, so that clients that pinned its fingerprint
still reach the server after a restart.

A generated certificate is kept in ``cert_dir=`` when given, else in the per-user state directory
(:func:`state_dir`: ``$M2MWIRE_STATE_DIR``, else ``$XDG_STATE_HOME/m2mwire``, else
``~/.local/state/m2mwire``) under ``certs/<host>/``, one per host name the server listens on.
``cert_dir=False`` keeps it in memory only (a new fingerprint at every start). Layout:
``cert.pem`` and ``key.pem`` (0600) in a 0700 directory.

Several processes may start at once on the same directory (``m2mwire serve --workers N``, or a
service manager starting instances), so each file is created whole or not at all (written to a
temporary file, then hard-linked to its name, which fails if another process linked first): the
key first, then a certificate for whichever key won. Every process ends up with the same pair.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import ssl
import tempfile
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from m2mwire.errors import ConfigError
from m2mwire.transport.tls import (
    certificate_fingerprint,
    generate_self_signed,
    load_server_certificate,
    private_key_pem,
    self_signed_certificate,
    server_ssl_context,
)

__all__ = [
    "STATE_DIR_ENV",
    "default_cert_dir",
    "persistent_self_signed",
    "server_certificate_files",
    "server_context",
    "state_dir",
]

logger = logging.getLogger("m2mwire.transport")

STATE_DIR_ENV = "M2MWIRE_STATE_DIR"
_DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = ("", "0.0.0.0", "::")


def state_dir() -> Path:
    """m2mwire's per-user state directory: ``$M2MWIRE_STATE_DIR``, else ``$XDG_STATE_HOME/m2mwire``
    (the XDG base directory for state that should survive restarts), else ``~/.local/state/m2mwire``."""
    own = os.environ.get(STATE_DIR_ENV)
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is invalid and ignored
        return Path(xdg) / "m2mwire"
    return Path.home() / ".local" / "state" / "m2mwire"


def default_cert_dir(host: str) -> Path:
    """Where a server listening on ``host`` keeps its generated certificate by default: one
    directory per host name (quoted, so any name is one safe path component), so servers on
    different names do not share a certificate made for another."""
    return state_dir() / "certs" / urllib.parse.quote(host.lower() or "0.0.0.0", safe="")


def certificate_names(host: str) -> tuple[str, ...]:
    """The subjectAltNames of a certificate generated for a server on ``host``: the host itself
    (unless it is a wildcard address) first, then localhost and the loopback addresses."""
    if host in _WILDCARDS or host.lower() in _DEFAULT_NAMES:
        return _DEFAULT_NAMES
    return (host, *_DEFAULT_NAMES)


def _make_private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700 (os.makedirs would give the parents
    the umask's mode; the XDG spec asks 0700 for a state directory it creates)."""
    missing = list(itertools.takewhile(lambda p: not p.exists(), (path, *path.parents)))
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            directory.mkdir(mode=0o700)


def _create_once(path: Path, data: bytes) -> None:
    """Write ``path`` unless it exists, atomically: other processes see no file or all of it, and
    of concurrent writers exactly one wins (os.link fails when the name exists)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process was first: theirs is kept
            os.link(temp, path)
    finally:
        os.unlink(temp)


def persistent_self_signed(
    cert_dir: str | os.PathLike[str], hostnames: tuple[str, ...] = _DEFAULT_NAMES
) -> tuple[str, str, str]:
    """``(certfile, keyfile, fingerprint)`` of the self-signed certificate kept in ``cert_dir``.

    The first call generates it (for ``hostnames``) and writes ``key.pem`` and ``cert.pem`` (0600,
    in a 0700 directory); later calls, in this process, another one or after a restart, load the
    same pair. OSError when the directory cannot be made or read; ConfigError when it holds a
    certificate that is not the key's.
    """
    directory = Path(cert_dir)
    certfile, keyfile = directory / "cert.pem", directory / "key.pem"
    if not keyfile.exists():
        _make_private_dir(directory)
        _create_once(keyfile, private_key_pem(ec.generate_private_key(ec.SECP256R1())))
    key = serialization.load_pem_private_key(keyfile.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{keyfile} is not an ECDSA key as m2mwire generates: remove {directory}")
    if not certfile.exists():
        cert = self_signed_certificate(key, hostnames)
        _create_once(certfile, cert.public_bytes(serialization.Encoding.PEM))
    cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    if _public_der(cert.public_key()) != _public_der(key.public_key()):
        raise ConfigError(
            f"{certfile} is not the certificate of {keyfile}: remove both to generate a new pair "
            "(clients will then need the new fingerprint)"
        )
    return str(certfile), str(keyfile), certificate_fingerprint(cert)


def _public_der(key: Any) -> bytes:
    return bytes(
        key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def server_certificate_files(
    options: Mapping[str, Any], host: str
) -> tuple[str | None, str | None, str | None]:
    """``(certfile, keyfile, fingerprint)`` serve()'s options name for a server on ``host``:
    certfile/keyfile as given (no fingerprint: the user's own certificate), the generated one
    kept in ``cert_dir`` or by default in :func:`default_cert_dir`, or all None with
    ``cert_dir=False`` or when the default directory cannot be written (the transport then
    generates a certificate in memory)."""
    certfile = options.get("certfile")
    if certfile is not None:
        return os.fspath(certfile), options.get("keyfile"), None
    cert_dir = options.get("cert_dir")
    if cert_dir is False:
        return None, None, None
    names = certificate_names(host)
    if cert_dir is not None:
        if not isinstance(cert_dir, str | os.PathLike):
            raise ConfigError(
                "cert_dir= takes a directory, or False to keep a generated certificate in memory "
                f"only, not {cert_dir!r}"
            )
        try:
            kept = persistent_self_signed(cert_dir, names)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cert_dir={os.fspath(cert_dir)!r}: cannot keep the certificate there: {exc}"
            ) from None
    else:
        directory = default_cert_dir(host)
        try:
            kept = persistent_self_signed(directory, names)
        except (OSError, ValueError) as exc:  # e.g. a read-only home: serve as before rather than fail
            logger.warning(
                "cannot keep the generated certificate in %s (%s): using one in memory, with a new "
                "fingerprint at every start. Set %s or pass cert_dir= to keep it elsewhere, or "
                "cert_dir=False to keep it in memory without this warning",
                directory,
                exc,
                STATE_DIR_ENV,
            )
            return None, None, None
    logger.warning(
        "server on %s uses the self-signed certificate kept in %s, SHA-256 fingerprint %s "
        "(clients: connect with fingerprint=%s)",
        host or "*",
        os.path.dirname(kept[0]),
        kept[2],
        kept[2],
    )
    return kept


def server_context(options: Mapping[str, Any], target: str, host: str) -> tuple[ssl.SSLContext, str | None]:
    """The server TLS context serve()'s options ask for, and the fingerprint of a certificate we
    generated (None for the user's own): ``ssl=``, certfile/keyfile, the kept one (see
    :func:`server_certificate_files`), or a fresh one in memory (its fingerprint logged as a
    WARNING naming ``target``)."""
    given = options.get("ssl")
    if given is not None:
        return given, None
    certfile, keyfile, fingerprint = server_certificate_files(options, host)
    if certfile is not None:
        if fingerprint is None:
            return load_server_certificate(certfile, keyfile), None
        return server_ssl_context(certfile, keyfile), fingerprint
    cert = generate_self_signed(certificate_names(host))
    certfile, keyfile = cert.write_temp_files()
    logger.warning(
        "%s uses a generated self-signed certificate, SHA-256 fingerprint %s", target, cert.fingerprint
    )
    return server_ssl_context(certfile, keyfile), cert.fingerprint
