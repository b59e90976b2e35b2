"""Files tdbg writes and reads back: graphs and their inputs (graph_io), repro.py and
minifier_launcher.py (repro), and the dumper that writes them while a program runs (dump)."""
