"""What the two headless-Chromium scripts share: the browser's command-line options and flags, the checks before a
run, the launch, and the one line a failed check ends with."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


class Failed(Exception):
    """A check failed: its message is the one line the script ends with."""


def add_browser_options(parser: argparse.ArgumentParser, timeout: float) -> None:
    parser.add_argument("--out", default=str(REPO / "docs" / "images"), help="where the PNGs go (default docs/images)")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM", "/usr/bin/chromium"), help="browser binary")
    parser.add_argument("--timeout", type=float, default=timeout,
                        help=f"seconds to wait for a page (default {timeout:.0f})")


def run_checked(name: str, parser: argparse.ArgumentParser, run: Callable, argv: list[str] | None) -> int:
    """Parse, check that the browser is there, run; a Failed check is one line on stderr and exit status 1."""
    args = parser.parse_args(argv)
    try:
        if not Path(args.chromium).exists():
            raise Failed(f"no Chromium at {args.chromium}: install it (sudo apt-get install chromium) "
                         f"or pass --chromium PATH")
        try:
            from playwright.sync_api import sync_playwright  # noqa: F401
        except ImportError:
            raise Failed("the Python package playwright is missing: pip install playwright "
                         "(its browser download is not needed)") from None
        run(args)
    except Failed as exc:
        print(f"{name}: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


def launch(pw, chromium: str):
    """Headless Chromium from `chromium` (a fresh temporary profile, deleted on close)."""
    from playwright.sync_api import Error

    try:
        return pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
    except Error as exc:
        raise Failed(f"cannot start {chromium}: {str(exc).strip().splitlines()[0]}") from None
