"""Saying what is wrong: accuracy against eager, backend and compiler bisection, graph-break
and recompile explanation, profiling."""
