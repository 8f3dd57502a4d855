"""`python -m orchestrator` is the same as the `orchestrator` console script."""

from __future__ import annotations

from orchestrator.cli import main

raise SystemExit(main())
