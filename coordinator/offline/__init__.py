"""``rankscope analyze``: the live detectors run over dump trees made elsewhere (msProbe's
own, MindSpore or PyTorch, or rankscope's ``collect``).

- ``tree``: which (step, rank) has a dump.json, from folder names only.
- ``dump_rows``: one dump.json as the rows a rank would have streamed.
- ``replicas``: which columns the ranks hold bit for bit (weights, reduced gradients).
- ``steps``: reading one step of every rank, in parallel, into step batches.
- ``run``: the coordinator's core fed step by step; incident folder, report, verdict.
- ``synthetic_tree``: a data-parallel job's tree in msProbe's layout, for tests and bench.
"""
