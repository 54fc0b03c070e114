"""Reading and writing the corpus files (one sentence per line, UTF-8, gzip) of examples/data/."""
import gzip


def read_gz(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def write_gz(path, lines):
    """mtime=0 and no file name in the header: the same lines give byte-identical files."""
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write("".join(line + "\n" for line in lines).encode("utf-8"))
