"""The feature store: Feast, offline tables, the point-in-time rule, online reads and writes, skew, training sets."""

from feature_defs.compile.feast_typechecks import skip_feast_typechecks

skip_feast_typechecks()  # before this package's modules import Feast
