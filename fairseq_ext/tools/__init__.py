"""Command-line tools: `python -m fairseq_ext.tools.<name> --help`."""
