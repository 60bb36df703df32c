"""The console script. A base install (serving) has no CLI dependencies: say so plainly."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from tunectl.cli import main as cli_main
    except ModuleNotFoundError as exc:
        sys.stderr.write(
            f"error: the tunectl CLI needs the tuning extras ({exc.name} is missing): "
            "pip install 'tunectl[tune]'\n"
        )
        raise SystemExit(2) from None
    cli_main()
