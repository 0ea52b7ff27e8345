"""What the coordinator learns of each job: its parallel layout, which rows of a step
compare, its job-wide rank ids, its ranks' re-runs."""
