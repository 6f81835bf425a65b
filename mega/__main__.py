"""`python -m mega ...` is the `mega` command (what the hosts' own child processes run)."""

from mega.runtime.cli import main

main()
