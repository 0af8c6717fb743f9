"""Reading a dataset file only when it is a regular file (images: images.py, label files: labels.py).

A FIFO among the images or labels blocks a plain read forever (check-data hangs), a link to /dev/zero reads until
memory runs out, and a dangling link or a folder named `x.jpg` holds no file at all. read_regular opens without
blocking (O_NONBLOCK: a FIFO opens at once), asks the opened file what it is (fstat: no race with a rename in
between) and reads only a regular file; anything else raises NotRegularFile saying what it is, which the scan
reports as it reports any bad image or label file (`path: reason (skipped)`).
Test: python -m pytest -q tests/data/test_check.py -k regular
"""

import os
import stat

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(OSError):
    """A path that is no regular file: str(e) says what it is ('not a regular file: a FIFO (named pipe)')."""


def _kind(mode):
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path) -> bytes:
    """The bytes of regular file `path` (a symbolic link to one is followed). Raises FileNotFoundError for a path
    that does not exist, NotRegularFile for a dangling link, a folder, a FIFO, a device or a socket (never blocking
    on it and never reading it), OSError for a file that cannot be read."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        if os.path.islink(path):
            raise NotRegularFile(f"a dangling symbolic link (to {os.readlink(path)})") from None
        raise
    except (IsADirectoryError, PermissionError):
        if os.path.isdir(path):  # Windows refuses to open a folder
            raise NotRegularFile("not a regular file: a folder") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        link = f" (a link to {os.readlink(path)})" if os.path.islink(path) else ""
        raise NotRegularFile(f"not a regular file: {_kind(mode)}{link}")
    with os.fdopen(fd, "rb") as f:
        return f.read()
