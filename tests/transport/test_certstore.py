"""Where a TLS server's generated certificate is kept (m2mwire.transport.certstore)."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.synchronize
import stat
from pathlib import Path

import pytest
from cryptography import x509

from m2mwire.errors import ConfigError
from m2mwire.transport import certstore
from m2mwire.transport.tls import server_ssl_context


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_dir_is_the_env_var_else_xdg_else_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("M2MWIRE_STATE_DIR", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert certstore.state_dir() == tmp_path / "own"
    monkeypatch.delenv("M2MWIRE_STATE_DIR")
    assert certstore.state_dir() == tmp_path / "xdg" / "m2mwire"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # invalid per the XDG spec: ignored
    assert certstore.state_dir() == tmp_path / "home" / ".local" / "state" / "m2mwire"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert certstore.state_dir() == tmp_path / "home" / ".local" / "state" / "m2mwire"


def test_each_host_name_has_its_own_directory_and_names_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("M2MWIRE_STATE_DIR", str(tmp_path))
    dirs = {host: certstore.default_cert_dir(host) for host in ("127.0.0.1", "::1", "agent.example", "")}
    assert len(set(dirs.values())) == 4
    assert all(d.parent == tmp_path / "certs" and "/" not in d.name for d in dirs.values())
    assert certstore.default_cert_dir("Agent.Example") == dirs["agent.example"]  # DNS ignores case
    kept = {h: certstore.server_certificate_files({}, h) for h in ("127.0.0.1", "agent.example")}
    assert kept["127.0.0.1"][2] != kept["agent.example"][2]
    certfile = kept["agent.example"][0]
    assert certfile is not None
    cert = x509.load_pem_x509_certificate(Path(certfile).read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["agent.example", "localhost"]


def test_files_are_private(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    state = tmp_path / "a" / "b" / "state"  # none of it exists yet
    monkeypatch.setenv("M2MWIRE_STATE_DIR", str(state))
    certfile, keyfile, fingerprint = certstore.server_certificate_files({}, "127.0.0.1")
    assert certfile is not None and keyfile is not None and fingerprint is not None
    assert Path(certfile).parent == state / "certs" / "127.0.0.1"
    for directory in (state, state / "certs", state / "certs" / "127.0.0.1"):
        assert mode(directory) == 0o700, directory
    assert mode(Path(keyfile)) == 0o600 and mode(Path(certfile)) == 0o600
    assert sorted(p.name for p in Path(certfile).parent.iterdir()) == ["cert.pem", "key.pem"]  # no temp left
    server_ssl_context(certfile, keyfile)  # a pair that loads


def _first_start(
    directory: str, barrier: multiprocessing.synchronize.Barrier, results: multiprocessing.SimpleQueue[str]
) -> None:
    barrier.wait(10)  # all at once, as the workers of `m2mwire serve --workers N` start
    certfile, keyfile, fingerprint = certstore.persistent_self_signed(directory)
    server_ssl_context(certfile, keyfile)  # raises if this process got a key and another's certificate
    results.put(fingerprint)


def test_concurrent_first_starts_agree_on_one_certificate(tmp_path: Path) -> None:
    count = 6
    context = multiprocessing.get_context("fork")  # the children need nothing but this module
    for attempt in range(3):  # three races, each on a fresh directory
        directory = str(tmp_path / f"race{attempt}")
        barrier, results = context.Barrier(count), context.SimpleQueue()
        children = [
            context.Process(target=_first_start, args=(directory, barrier, results)) for _ in range(count)
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(20)
        assert [child.exitcode for child in children] == [0] * count
        fingerprints = [results.get() for _ in range(count)]
        assert len(set(fingerprints)) == 1, fingerprints
        assert certstore.persistent_self_signed(directory)[2] == fingerprints[0]


def test_opt_out_and_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("M2MWIRE_STATE_DIR", str(tmp_path / "state"))
    assert certstore.server_certificate_files({"cert_dir": False}, "127.0.0.1") == (None, None, None)
    assert not (tmp_path / "state").exists()
    with pytest.raises(ConfigError, match="cert_dir= takes a directory, or False"):
        certstore.server_certificate_files({"cert_dir": True}, "127.0.0.1")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"cert_dir=.*cannot keep the certificate there"):
        certstore.server_certificate_files({"cert_dir": blocker / "sub"}, "127.0.0.1")
    # An unusable default (e.g. a read-only home) must not stop a server: memory, and a warning.
    monkeypatch.setenv("M2MWIRE_STATE_DIR", str(blocker))
    with caplog.at_level(logging.WARNING, logger="m2mwire.transport"):
        assert certstore.server_certificate_files({}, "127.0.0.1") == (None, None, None)
    assert "M2MWIRE_STATE_DIR" in caplog.text and "cert_dir=False" in caplog.text


def test_a_certificate_that_is_not_the_keys_is_reported(tmp_path: Path) -> None:
    certstore.persistent_self_signed(tmp_path / "one")
    certstore.persistent_self_signed(tmp_path / "two")
    (tmp_path / "one" / "cert.pem").write_bytes((tmp_path / "two" / "cert.pem").read_bytes())
    with pytest.raises(ConfigError, match=r"is not the certificate of .*remove both"):
        certstore.persistent_self_signed(tmp_path / "one")
