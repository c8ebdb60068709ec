"""The OCI distribution edge: references, credentials, the HTTP API, moving blobs."""
