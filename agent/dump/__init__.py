"""msProbe's on-disk dump: ``dump_path/step{N}/rank{ID}/dump.json`` and friends.

- :mod:`.writer`: the local dump sink; :mod:`.files`: the file formats;
- :mod:`.folder_claim`: two processes claiming one rank never share a folder.
"""
