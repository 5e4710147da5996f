"""The chaos and fuzzing tests run the whole stack, with the end-to-end fixtures."""

from tests.e2e.conftest import make_stack

__all__ = ["make_stack"]
