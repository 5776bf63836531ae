"""Results: the plain dataclasses flow produces and reports render (the ground floor both stand on).

Nothing here imports flow, emit, passes or reports; each module is one result: compile_log (the compile loop's rows
and trace), signoff, verify; the analysis is softsyn.timing.results (the timer's own output).
"""
