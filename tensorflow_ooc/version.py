"""The package version, in a module of its own: the store writer records it in every store, and
importing the package root for it loaded every stage, the kernels included, whenever a store was
written."""

__version__ = "0.1.0"
