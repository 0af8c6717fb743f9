"""Naming the file behind libjpeg's "Corrupt JPEG data: ..." lines.

libjpeg prints its warnings ("Corrupt JPEG data: premature end of data segment", "... N extraneous bytes
before marker 0xd9") straight to file descriptor 2, without a file name, at every decode of such a file. The
scan decodes every image once with fd 2 captured (captured_stderr); when a capture holds such lines, the scan
decodes its JPEGs again one at a time (attribute) to say which file each line belongs to, as a warning
`path: libjpeg: Corrupt JPEG data: ...` kept in the label cache. Whatever else the capture holds is written back
to stderr. Test: python -m pytest -q tests/data/test_data_labels.py -k libjpeg
"""

import contextlib
import os
import sys
import tempfile

MARK = "Corrupt JPEG data"


class Captured:
    text = ""


@contextlib.contextmanager
def captured_stderr():
    """fd 2 goes to a temporary file for the block; yields a Captured whose .text holds it afterwards (the
    lines without MARK are written back to stderr). Without a usable fd 2 nothing is captured."""
    cap = Captured()
    try:
        saved = os.dup(2)
    except OSError:
        yield cap
        return
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield cap
        finally:  # also on an error: fd 2 back, and what was not libjpeg's reaches the terminal
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            cap.text = tmp.read().decode("utf-8", "replace")
            other = "".join(ln for ln in cap.text.splitlines(keepends=True) if MARK not in ln)
            if other:
                sys.stderr.write(other)
                sys.stderr.flush()


def attribute(files, check, expected):
    """Run check(path) on each JPEG of `files` with fd 2 captured until `expected` MARK lines are found.
    Returns ['path: libjpeg: <line> (...)'] for the files that printed them; check's exceptions are ignored."""
    notes, found = [], 0
    for f in files:
        if found >= expected:
            break
        if not str(f).lower().endswith((".jpg", ".jpeg", ".mpo")):
            continue
        with captured_stderr() as cap:
            try:
                check(f)
            except Exception:  # noqa: BLE001 (the scan reports the file's own error)
                pass
        lines = [ln.strip() for ln in cap.text.splitlines() if MARK in ln]
        found += len(lines)
        notes += [f"{f}: libjpeg: {ln} (the image decodes; libjpeg repeats this line without a file name at every "
                  f"load: re-save the image to silence it)" for ln in dict.fromkeys(lines)]
    return notes
