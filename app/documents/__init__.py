"""Private documents: extract, chunk, index (encrypted at rest), retrieve,
build a prompt whose document text is content only, and cite the passages.
No Qt here; the CLI (``ferry docs``), ``app/controller/passages.py`` and ``app/ui/documents_panel.py`` use it.
See docs/DOCUMENTS.md."""
