"""``python -m app`` opens the Ferry window (see app/ui/app.py)."""
import sys

from app.ui.app import main

if __name__ == "__main__":
    sys.exit(main())
