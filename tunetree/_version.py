"""The package version, importable without importing the package's layers."""

__version__ = "0.1.0"
