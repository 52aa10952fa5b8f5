"""The store: every statement the farm runs, the tables they run on, and the engine they run through.

database.py opens a farm database; schema.py and migrations.py define and upgrade its tables; sql/ holds the
statements by subject (the hot ones built once); stores.py's Store (over base.py) builds every store once (jobs,
runs, machines, turns, roster, queues, schedules, locks, flows, lineage, bulk, views, stats, events), so a caller
reaches each through it (`store.queues`) and never builds one.
A module here imports SQLAlchemy, rules/ and the store's own modules, never a node, an executor or the Farm.
"""
