"""``python -m studio.curation``: a documented command, kept; it runs the curation CLI."""
from studio.curation import main

if __name__ == "__main__":
    raise SystemExit(main())
