"""One command line per chapter: every argparse table, and every message that names a flag the
user typed."""
