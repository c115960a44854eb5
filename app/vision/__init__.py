"""Images in the conversation (Kimi K3's vision tower): decoding an image
safely, resizing it to a patch budget and normalising it as the release's
processor does, and laying its positions into the prompt as the chat format
does. No Qt here; every front end uses this. See docs/KIMI.md, "Images"."""
