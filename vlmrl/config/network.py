"""Settings that open the run to the network, checked once: listening addresses, bearer-token files, Ray's
authentication. The exporter (``vlmrl.trainer.prometheus``) and the Ray launcher use the same functions the config
checks call."""

from __future__ import annotations

import ipaddress
import os
import re
import stat

from vlmrl.config.errors import ConfigError

MIN_TOKEN_CHARS = 16
"""The shortest secret a token file may hold."""
MAX_TOKEN_FILE_BYTES = 4096
_PRINTABLE = re.compile(r"[\x20-\x7e]+")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token_file(path: str) -> str:
    """The secret in ``trainer.prometheus.token_file``, or ``ConfigError`` saying what to fix: the file must be a
    regular file (not a FIFO or a device: nothing blocks), writable by its owner only (``chmod 600``: nobody else can
    swap the secret), of at most ``MAX_TOKEN_FILE_BYTES``, holding at least ``MIN_TOKEN_CHARS`` printable ASCII
    characters (surrounding whitespace is dropped). The compose-time check can call it too."""
    what = f"trainer.prometheus.token_file: {path}"
    fd = -1
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(
                f"{what} is not a regular file (a FIFO, a device or a folder): point it at a file holding the secret"
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                f"{what} can be written by other users (mode {stat.filemode(st.st_mode)}), who could "
                f"replace the secret: chmod 600 {path}"
            )
        if st.st_size > MAX_TOKEN_FILE_BYTES:
            raise ConfigError(
                f"{what} is {st.st_size} bytes: a token file holds one secret (at most {MAX_TOKEN_FILE_BYTES} bytes)"
            )
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
            raise ConfigError(f"{what} is not a regular file")
        raw = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"trainer.prometheus.token_file: cannot read {path}: {e}") from e
    finally:
        if fd >= 0:
            os.close(fd)
    token = raw.decode("utf-8", errors="replace").strip()
    if not token:
        raise ConfigError(f"{what} is empty")
    if not _PRINTABLE.fullmatch(token):
        raise ConfigError(
            f"{what} holds characters a scraper cannot send in a header (control characters, non-ASCII, several "
            "lines): write the secret on one line, e.g. openssl rand -hex 32"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{what} holds a {len(token)}-character secret, too short to resist guessing: use at least "
            f"{MIN_TOKEN_CHARS} characters, e.g. openssl rand -hex 32 > {path}; chmod 600 {path}"
        )
    return token


def prometheus_problems(host: str, port: int, token_file: str | None) -> list[str]:
    """Problems of ``trainer.prometheus``: a non-loopback host without a token file, a token file
    :func:`read_token_file` refuses, a port that is no port."""
    p = []
    if token_file:
        try:
            read_token_file(token_file)
        except ConfigError as e:
            p.append(f"{e}.")
    elif not is_loopback(host):
        p.append(
            f"trainer.prometheus.host={host} accepts connections from other machines: set "
            "trainer.prometheus.token_file (a file holding a secret; scrapers send it as a bearer token), or keep "
            "the default 127.0.0.1."
        )
    if not 0 <= port <= 65535:
        p.append(f"trainer.prometheus.port={port}: a port number (0 = any free port).")
    return p


def ray_auth_problem() -> str | None:
    """Why this environment may not run Ray (``RAY_AUTH_MODE=disabled``), or None."""
    if os.environ.get("RAY_AUTH_MODE") == "disabled":
        return (
            "RAY_AUTH_MODE=disabled: vlmrl does not run Ray without authentication (anyone who reaches the cluster's "
            "ports could run code as you). Unset it: Ray then uses token authentication (README, GPUs and clusters)"
        )
    return None
