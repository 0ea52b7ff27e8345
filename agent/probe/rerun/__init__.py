"""A second look at an anomalous step: re-run in the rank before its gradients are
reduced, and the files that let it be replayed elsewhere."""
