"""The store: every statement the farm runs, the tables they run on, and the engine they run through.

database.py opens a farm database; schema.py and migrations.py define and upgrade its tables; sql/ holds
the statements by subject (the hot ones built once); stores.py's Store (over base.py) reaches jobs.py, runs.py, machines.py, turns.py and
settings.py, and roster.py, queues.py, schedules.py, locks.py and views.py run theirs over the same base.
A module here imports SQLAlchemy, rules/ and the store's own modules, never a node, an executor or the Farm.
"""
