"""`softsyn characterize`: measure a target library on this machine's runtime and device.

plan drives a run: the ceilings first (ceilings), then every cell of the catalogue (catalogue; their graphs built
by recipes on cellgraph), each grid point timed by runner, the library written by writer after each cell; probe
records the machine's speed.
"""
