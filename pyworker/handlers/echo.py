"""Deprecated import path, kept so existing code keeps working: use `pyworker.worker.echo`.

This module *is* `pyworker.worker.echo` (same objects, same registry), not a copy.
"""

import sys

import pyworker.worker.echo

sys.modules[__name__] = pyworker.worker.echo
