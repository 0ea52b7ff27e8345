"""The rank's communication: the parallel layout its groups show, the collectives it
calls from Python, and where it stands in them."""
