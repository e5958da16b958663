"""The cache fixtures (tests/support/cache_fixtures.py): `plan`, and every test's TMPDIR inside its tmp_path."""
from tests.support.cache_fixtures import plan, private_tmpdir  # noqa: F401  (fixtures, registered by import)
