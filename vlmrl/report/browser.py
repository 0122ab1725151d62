"""A screenshot of the report in a headless Chromium (when one is installed), with the network cut off: what the
page shows is what it holds. Used by the report's test and for the README's picture."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The path of a Chromium-family browser on PATH, or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(
    page: str | os.PathLike,
    png: str | os.PathLike,
    width: int = 1100,
    height: int = 2400,
    browser: str | None = None,
    timeout_s: float = 120.0,
) -> Path:
    """Render ``page`` headless at ``width`` x ``height`` into ``png``; every host name resolves to nothing and no
    proxy answers, so an external resource would show as missing. Raises ``RuntimeError`` with the browser's output
    when no screenshot came out."""
    browser = browser or find_browser()
    if browser is None:
        raise RuntimeError(f"no browser found (looked for {', '.join(BROWSERS)})")
    out = Path(png)
    out.unlink(missing_ok=True)
    cmd = [
        browser,
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--mute-audio",
        f"--window-size={width},{height}",
        f"--screenshot={out}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-server=127.0.0.1:9",
        "--virtual-time-budget=5000",
        Path(page).resolve().as_uri(),
    ]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if not out.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return out
