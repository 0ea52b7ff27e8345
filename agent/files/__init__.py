"""Files one process writes and another (or a person, or msProbe) reads, outside the
wire: atomic replacement, MindSpore's kernel dump, a step's replay files, and
msProbe's statistics of an array as its dump.json holds them."""
