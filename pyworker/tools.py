"""Deprecated import path, kept so existing code keeps working: use `pyworker.agent.tools`.

This module *is* `pyworker.agent.tools` (same objects, same registry), not a copy.
"""

import sys

import pyworker.agent.tools

sys.modules[__name__] = pyworker.agent.tools
