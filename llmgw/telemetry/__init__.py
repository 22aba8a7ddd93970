"""OpenTelemetry GenAI spans and metrics, the billing record, and JSON logs."""
