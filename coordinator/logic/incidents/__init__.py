"""Incidents: opened from verdicts, driven by a transition table, kept on disk; the
consistent cut; crashes and hangs named by the rank that failed first."""
