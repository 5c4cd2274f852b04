"""Support code that tests, benchmarks and chaos runs share (not used by the services)."""
