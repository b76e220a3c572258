"""Everything that is not a lesson: command lines, the run's wiring, the data engines and their I/O,
the Hugging Face bridge, the sweep. It may import any chapter at the root; no chapter imports it,
except the three-line `if __name__ == "__main__":` stub that hands argv to
machinery/commands/<chapter>.py."""
