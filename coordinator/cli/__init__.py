"""The coordinator-side verbs of ``rankscope``: one module per verb (``launch``, ``demo``,
``coordinator``, ``control`` for status/pause/resume/step/terminate/export/collect,
``report``, ``bench``), each a thin ``main(argv)`` over the room that does the work."""
