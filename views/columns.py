"""The columns of the CTR view, engine-free: the API, the serving layer and the DAGs read them
without importing Spark."""

from __future__ import annotations

from typing import Final

DIMENSIONS: Final = ("campaign_id", "ad_id", "site_id", "country", "device_type")
CTR_COLUMNS: Final = ("bucket_start", *DIMENSIONS, "impressions", "clicks")
