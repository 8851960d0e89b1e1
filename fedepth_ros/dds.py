"""The DDS settings fedepth's nodes start with: Fast DDS's profile for large messages.

:func:`use_large_data_profile` points ``FASTDDS_DEFAULT_PROFILES_FILE`` at
``fastdds_large_data.xml`` (next to this module) before ``rclpy.init``, unless the process runs
another RMW or already names a profile file. Without it, best-effort samples larger than Fast
DDS's 512 KiB shared-memory segment (640x480 depth) never reached a subscriber in another
process on this machine; the file says why in more detail.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

#: The profile shipped with the package.
LARGE_DATA_PROFILE = Path(__file__).with_name("fastdds_large_data.xml")
#: Environment variables by which Fast DDS reads a profile file (the second is deprecated).
PROFILE_VARS = ("FASTDDS_DEFAULT_PROFILES_FILE", "FASTRTPS_DEFAULT_PROFILES_FILE")


def use_large_data_profile(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set the profile file for this process (and its children); returns the path set, or
    None when the environment already decides (another RMW, or a profile file named)."""
    rmw = environ.get("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    if not rmw.startswith("rmw_fastrtps") or any(environ.get(v) for v in PROFILE_VARS):
        return None
    environ["FASTDDS_DEFAULT_PROFILES_FILE"] = str(LARGE_DATA_PROFILE)
    return str(LARGE_DATA_PROFILE)
