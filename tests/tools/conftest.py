from tests.server.conftest import tiny_k3, tool_templates  # noqa: F401 - the models with tool formats
