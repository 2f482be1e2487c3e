"""Retrieval QA: tasks with their own evidence pools, BM25 over a pool."""
