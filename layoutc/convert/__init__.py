"""Checkpoints: ``layoutc convert`` of safetensors shards, read and written byte for byte."""
