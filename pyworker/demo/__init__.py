"""`runrow demo`: the live demo (two workers, a kill, a resume), its rendering and its tools.

Imports anything below it (db, worker, agent, fake); only the CLI imports it.
"""
