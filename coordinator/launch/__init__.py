"""``rankscope launch``: one watched job on this machine.

- :mod:`.runner`: ``Launch``, owner of every process it starts.
- :mod:`.env`: the environment that attaches every rank process.
- :mod:`.progress`: what the terminal shows while the job runs and when it ends.
- :mod:`.preflight`: what is checked before anything starts.
- :mod:`.watched`: which ranks were watched, and the closing line.
"""
