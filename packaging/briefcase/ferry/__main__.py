"""``python -m ferry`` inside the app bundle: open the Ferry window."""
import sys

from app.ui.app import main

if __name__ == "__main__":
    # Finder on older macOS passes a process serial number ("-psn_0_1234");
    # it is not one of Ferry's options.
    sys.exit(main([a for a in sys.argv[1:] if not a.startswith("-psn_")]))
