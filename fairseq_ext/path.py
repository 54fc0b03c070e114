"""The folder to give fairseq's --user-dir, wherever fairseq_ext is installed.

fairseq imports a --user-dir by its path (the package folder), not by its module name, so
`--user-dir fairseq_ext` works only from the repository root. From any folder:

    fairseq-train DATA_BIN --user-dir "$(python -m fairseq_ext.path)" --arch transformer_balanced ...
    fairseq-ext-user-dir                   # the same, as a console script

Prints the absolute path of the imported fairseq_ext package on stdout and nothing else.
"""
import os


def user_dir():
    """Absolute path of the fairseq_ext package folder this module belongs to."""
    return os.path.dirname(os.path.abspath(__file__))


def main():
    print(user_dir())


if __name__ == "__main__":
    main()
