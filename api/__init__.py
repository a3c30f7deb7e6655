"""HTTP API: /api/v1/ctr, /api/v1/views, /api/v1/sql, /healthz, /metrics, the dashboard."""
