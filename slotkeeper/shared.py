"""Where the shared reference material (Haizea's traces and configs) lives: beside the repository (`../shared`, as
in CI's checkout), or wherever SLOTKEEPER_SHARED points."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    explicit = os.environ.get("SLOTKEEPER_SHARED")
    if explicit:
        return Path(explicit)
    for candidate in (REPO.parent / "shared", Path("/work/shared")):
        if candidate.is_dir():
            return candidate
    return REPO.parent / "shared"


HAIZEA = shared_dir() / "haizea"
