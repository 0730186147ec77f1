"""The settings of the property tests: derandomized so that the suite is repeatable;
PICASSO_PROPERTY_EXAMPLES=N (and PICASSO_PROPERTY_RANDOM=1) explores further."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROPERTY = settings(
    max_examples=int(os.environ.get("PICASSO_PROPERTY_EXAMPLES", "150")),
    derandomize=os.environ.get("PICASSO_PROPERTY_RANDOM") != "1",
    deadline=None,  # never a timing assertion
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
