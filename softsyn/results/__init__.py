"""Results: the plain dataclasses flow produces and reports render (the ground floor both stand on).

Nothing here imports flow, emit, passes or reports. One module per result: analysis (what the timer returns:
Analysis, GroupTiming, AreaResult, TPPlan ...), compile_log (the compile loop's rows and trace), signoff, verify;
files (write_atomic, json_nulls) is how each reaches disk.
"""
