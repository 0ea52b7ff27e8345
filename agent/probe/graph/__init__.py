"""Compiled code (GRAPH mode and ``@jit``): keeping rankscope's Python out of every
compile, step boundaries seen from outside the compiled step, and MindSpore's kernel
dump configured and read off the training thread."""
