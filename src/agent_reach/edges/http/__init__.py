"""The HTTP edge: the v1 API, the dashboard's static files, /metrics, /openapi.json."""
