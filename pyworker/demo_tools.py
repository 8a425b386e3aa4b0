"""Deprecated import path, kept so existing code keeps working: use `pyworker.demo.tools`.

This module *is* `pyworker.demo.tools` (same objects, same registry), not a copy.
"""

import sys

import pyworker.demo.tools

sys.modules[__name__] = pyworker.demo.tools
