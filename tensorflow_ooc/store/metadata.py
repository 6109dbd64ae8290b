"""Names and version of the store format (see docs/FORMAT.md)."""

META_KEY = "tensorflow_ooc"
FORMAT_NAME = "blco"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
