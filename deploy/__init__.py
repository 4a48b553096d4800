"""Deployment assets generated from code: Grafana dashboards and the metric-name contract."""
