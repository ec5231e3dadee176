"""Data ingest and preprocessing of a cell atlas against scanpy."""
