"""`make demo`'s stages: one sha256 over a tree as it is on this Mac's disk, printed for the log
and written to $RELEVO_OUTPUT: every path's type, permission bits, mtime (ns), and its bytes'
sha256 or its link target. Run by the stage itself (not by relevo-agent), so the digests the
build and sign stages print on two Macs are an outside check of the handoff.

    python tree_digest.py PATH...
"""

import hashlib
import os
import stat
import sys


def rows(top: str):
    paths = [top]
    for root, directories, files in os.walk(top):
        directories.sort()
        paths += [os.path.join(root, name) for name in sorted(directories + files)]
    for path in sorted(set(paths)):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            yield f"symlink {path} -> {os.readlink(path)}"
        elif stat.S_ISDIR(info.st_mode):
            yield f"dir {path} {stat.S_IMODE(info.st_mode):o} {info.st_mtime_ns}"
        else:
            with open(path, "rb") as handle:
                content = hashlib.sha256(handle.read()).hexdigest()
            yield f"file {path} {stat.S_IMODE(info.st_mode):o} {info.st_mtime_ns} {content}"


if __name__ == "__main__":
    digest = hashlib.sha256()
    count = 0
    for top in sys.argv[1:]:
        for row in rows(top):
            digest.update(row.encode() + b"\n")
            count += 1
    print(f"{digest.hexdigest()} ({count} paths)")
