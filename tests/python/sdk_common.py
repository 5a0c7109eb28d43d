"""What the SDK scripts share: the failure report.

The scripts run as `python tests/python/SCRIPT.py ...` (`tests/src/sdk.rs`), so this
directory is on `sys.path` and `from sdk_common import check` finds this module.
"""
import sys


def check(cond, msg):
    """Exits non-zero with `FAILED: msg` on stderr unless `cond` holds."""
    if not cond:
        print(f"FAILED: {msg}", file=sys.stderr)
        sys.exit(1)
