"""The statements the stores run, a floor below them, by subject: portable.py (what every dialect says alike),
due.py (which queued jobs are due), gates.py (what a queue's row lets through), turns.py (the turn and its looks),
claim.py (the claim), runs.py (a run's lease and end) and machines.py (the check-in and the roster version).

Each hot statement is built once per shape (functools.cache) with everything that varies a bound parameter. A
module here imports SQLAlchemy, rules/ and the store's schema, never a store: the stores import it.
"""
