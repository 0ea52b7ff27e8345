"""The default watch: the data-parallel sentinels and vital signs divergence hunting
needs, the loss scale, and the budget that keeps their cost flat as the model grows."""
