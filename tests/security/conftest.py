"""Security fixtures: the tiny chat model (a real converted container with a
tokenizer and a Jinja chat template) from the UI fixtures."""
from tests.ui.conftest import tiny_chat  # noqa: F401
