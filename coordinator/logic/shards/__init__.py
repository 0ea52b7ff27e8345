"""Ingest shards: each aligns and judges its kinds of every step; their findings are
merged into the verdicts one core would give."""
