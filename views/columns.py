"""The columns of the CTR view, engine-free: the API, the serving layer and the DAGs read them
without importing Spark."""

from __future__ import annotations

from typing import Final

DIMENSIONS: Final = ("campaign_id", "ad_id", "site_id", "country", "device_type")
CTR_COLUMNS: Final = ("bucket_start", *DIMENSIONS, "impressions", "clicks")
# What a version with click attribution counts besides impressions and (attributed) clicks:
# every valid click event (deduplicated by event id) in its own bucket, the clicks with no
# impression within the window (in the click's bucket), and the clicks after an impression's
# first one (in the impression's bucket).
ATTRIBUTION_MEASURES: Final = ("raw_clicks", "orphan_clicks", "repeat_clicks")
# Every version's row fields: a version without attribution has raw_clicks = clicks and no
# orphan or repeat counts (null).
MEASURES: Final = ("impressions", "clicks", *ATTRIBUTION_MEASURES)
# Who a row reached, for reach and frequency (views.sketches): the batch layer writes the
# distinct users exactly and as sketches, the speed layer sketches only. ``users``/
# ``reach_sketch``: users with an impression in the row; ``clickers``/``clicker_sketch``: users
# with a click event. The exact sets, sorted: of user ids in the rows written before the user
# dictionary (batch/users, batch_layer.users) numbered the users (USER_LISTS), of the users'
# numbers since (USER_NUMBERS: four bytes a user, and counted 1.3-2.9x faster). User-level data:
# only admins read them in the SQL sandbox.
USER_LISTS: Final = ("users", "clickers")
SKETCHES: Final = ("reach_sketch", "clicker_sketch")
USER_NUMBERS: Final = ("user_nos", "clicker_nos")
# Who an hour row reached (batch_layer.hours): Roaring bitmaps of the users' numbers in the
# user dictionary (batch/users), exact, for the hours a batch run covered whole. User-level
# data like the lists: only admins read them in the SQL sandbox.
USER_BITMAPS: Final = ("user_bitmap", "clicker_bitmap")
