"""A node: one machine's part in the farm, its threads, and what only they use.

node.py starts and stops the threads (its table says which thread owns what); turn_timer.py takes turns and
claims; runner.py runs what was claimed; push.py hears new work on PostgreSQL; tally.py and metrics.py count it;
config.py holds a node's settings. A module here may import executors/, store/ and rules/, never the Farm or the CLI.
"""
