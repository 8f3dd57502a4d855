"""The results store: campaigns and runs in SQLite (WAL), one plain log file per run, and
the re-signing of old runs when the classifier changes (`signatures`). Below the campaign
that records into it; the reports above read it."""
