"""tdbg's debugging tools, grouped by job:

  runs/       run a script under a backend (resolver, child runner, instrumented session, fork servers)
  reduce/     shrink a failing graph (engine, passes, surgery, oracle, query workers, minify session)
  diagnose/   say what is wrong (accuracy, bisect, explain, profiling)
  artifacts/  files written and read back (graph_io, repro files, the run-time dumper)

Library code only: nothing here prints, exits or imports tdbg.cli.
"""
