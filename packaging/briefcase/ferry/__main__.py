"""``python -m ferry`` inside the app bundle: open the Ferry window."""
import sys
from pathlib import Path

from app import demo
from app.ui.app import main

if __name__ == "__main__":
    # The demo model travels with the app (packaging/briefcase_config.py copies it
    # here at build time): the first answer needs no network and no pip.
    demo.use_bundle(Path(__file__).resolve().parent / "resources")
    # Finder on older macOS passes a process serial number ("-psn_0_1234");
    # it is not one of Ferry's options.
    sys.exit(main([a for a in sys.argv[1:] if not a.startswith("-psn_")]))
