"""orchestrator: finds which server flag breaks an inference deployment."""

from __future__ import annotations

__version__ = "0.1.0"
