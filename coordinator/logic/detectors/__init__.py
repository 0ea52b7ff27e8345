"""The five detectors. Each judges one aligned step (a StepView) of one group with
array operations over ranks x columns and returns at most one Verdict: the first
rank (earliest execution index, ties named)."""
