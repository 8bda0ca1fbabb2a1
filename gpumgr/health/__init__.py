"""GPU health: the checks, their thresholds and the loop that marks cards unhealthy and healthy again.

- config.py: what is checked and with which thresholds (and the parsing of those settings).
- rules.py: the pure rules, from events, card status and time to "reason X is (not) present on card i".
- monitor.py: the loops that watch the cards and apply the rules to the node state.
"""
