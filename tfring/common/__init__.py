"""Framework-neutral Python pieces: loading the op library, lifecycle, process sets."""
