"""Process facts shared by the build executor and the server supervisor:
stdlib only, so any stage can import it without pulling in another's package."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
