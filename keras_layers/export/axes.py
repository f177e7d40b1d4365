"""Axis names the stages share.

The cache inputs' sequence axis of a decoder exported with its cache: the
trace names it (`causal_lm`), and the slim stage reads it to tell a decoder
with a cache (`slimming.slim`). Here, in a module that imports nothing, so
that neither stage imports the other for it.
"""

PAST_AXIS = "past_sequence"
