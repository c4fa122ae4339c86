"""Experiments, prediction logs, outcome attribution, online accuracy and sequential statistics."""
