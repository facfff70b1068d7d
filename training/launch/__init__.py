"""Starting a run: the command line checked, the ranks launched (local or torchrun), errors and
signals, the run directory's lock, and what a run says and saves at its start and end."""
