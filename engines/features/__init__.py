"""The feature store: Feast, offline tables, the point-in-time rule, online reads and writes, skew, training sets."""
