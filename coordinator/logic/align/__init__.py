"""Step alignment: every rank's records of one step side by side, the job-wide columns,
the ranks' states and groups, and messages taken in the order they were sent."""
