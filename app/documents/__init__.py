"""Private documents: extract, chunk, index (encrypted at rest), retrieve,
build a prompt whose document text is content only, and cite the passages.
No Qt here; the CLI (``ferry docs``) and ``app/ui/documents_panel.py`` use it.
See docs/DOCUMENTS.md."""
