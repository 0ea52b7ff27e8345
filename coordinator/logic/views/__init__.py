"""What the coordinator shows of what it judged: coverage, status, the per-rank series
and kept steps, watchpoints checked again, captured values."""
