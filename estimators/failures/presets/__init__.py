"""Failure-model data files (*.toml); loaded by estimators.failures.model."""
