"""The lab's fourth stage: the grid. Cells in order or on worker processes, what a run holds
(lock, stop signal, progress, log, store), the TOML grid file, and the memory and time estimate
checked before anything trains."""
