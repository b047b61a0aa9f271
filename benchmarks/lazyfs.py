"""A filesystem that loses what was not synced, as a power cut does (LazyFS's model):
the nemesis's power-loss fault, and the tests of what an fsync promises.

A FUSE passthrough (Debian's fuse3, the mfusepy binding) over a folder, `live`, that
holds what every process sees, at once. Beside it, what a power cut would leave: each
file's content as of its last fsync (or fdatasync), and each directory's entries
(creates, renames, unlinks, links) as of its last fsync of the directory. A cut puts
`live` back to that: the writes since a file's last fsync are gone, and so are the
entries since its directory's last fsync (an unsynced create is undone, an unsynced
rename or unlink too). Every process using the filesystem must be dead first, as
after a power cut: LazyFS.cut() kills them.

    with LazyFS(folder) as fs:          # mounted at fs.mount; always unmounted
        ...                             # a database on it
        fs.cut()                        # every user SIGKILLed, what was unsynced gone

    python benchmarks/lazyfs.py serve LIVE DURABLE MOUNT    # the daemon LazyFS starts

The daemon takes commands on its standard input, one a line, and answers each on its
standard output: "cut" ("cut done", or "cut refused: ..." while a file is open). It
needs root (allow_other: a PostgreSQL runs as its own user on it). Files are known by
an id of the daemon's own, not by inode number, which a deleted file gives up; the
durable content of file N is the file DURABLE/N.
"""

import contextlib
import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

WAIT = 30  # seconds to mount, to unmount, for a killed user to be gone
# seconds the kernel keeps what it was told of a name or a file (PostgreSQL asks a
# file's size at each read of it); a cut waits them out, so that no one sees the past
CACHED = 1
COPY = 1 << 20  # bytes copied at a time to the durable side


class Model:
    """The live folder and what a cut would leave of it: the mfusepy operations."""

    use_ns = True  # utimens in nanoseconds

    def __init__(self, live, durable):
        self.live, self.durable = Path(live), Path(durable)
        self.mutex = threading.RLock()
        self.ids, self.next_id = {}, 1  # a live inode's file id
        self.handles = {}  # an open file handle (our fd): its file id
        self.dirty = {}  # file id: [start, end) ranges written since its fsync
        self.entries = {}  # directory id: {name: file id}, as of its last fsync
        self.kinds = {}  # file id: ("dir" | "file" | "link", mode, uid, gid, target)
        self.take_durable()

    # -- the durable side --

    def path(self, path):
        return str(self.live) + path

    def id_of(self, live_path):
        """The file id of what live_path names; a new one if it has none."""
        found = os.lstat(live_path)
        fid = self.ids.get(found.st_ino)
        if fid is None:
            fid, self.next_id = self.next_id, self.next_id + 1
            self.ids[found.st_ino] = fid
        return fid

    def take_durable(self):
        """All of live, as it is, durable: at the mount, and after a cut."""
        self.ids.clear()
        self.dirty.clear()
        self.entries.clear()
        self.kinds.clear()
        shutil.rmtree(self.durable, ignore_errors=True)
        self.durable.mkdir(parents=True)
        self.root = self.id_of(str(self.live))
        self.note_kind(self.root, str(self.live))
        for folder, _dirs, files in os.walk(self.live):
            self.sync_entries(folder)
            for name in files:
                fid = self.id_of(os.path.join(folder, name))
                if self.kinds[fid][0] == "file":
                    shutil.copyfile(os.path.join(folder, name), self.durable / str(fid))

    def note_kind(self, fid, live_path):
        found = os.lstat(live_path)
        kind = (
            "dir"
            if stat.S_ISDIR(found.st_mode)
            else "link"
            if stat.S_ISLNK(found.st_mode)
            else "file"
        )
        target = os.readlink(live_path) if kind == "link" else None
        self.kinds[fid] = (kind, found.st_mode, found.st_uid, found.st_gid, target)

    def sync_entries(self, live_folder):
        """A directory's fsync: its entries as they are now become durable."""
        fid = self.id_of(live_folder)
        self.note_kind(fid, live_folder)
        named = {}
        for name in os.listdir(live_folder):
            child = os.path.join(live_folder, name)
            named[name] = child_id = self.id_of(child)
            if child_id not in self.kinds or self.kinds[child_id][0] != "file":
                self.note_kind(child_id, child)
            if self.kinds[child_id][0] == "dir":
                self.entries.setdefault(child_id, {})  # new: empty until its fsync
        self.entries[fid] = named

    def sync_data(self, fid, fd):
        """A file's fsync: what was written to it since its last one becomes durable."""
        target = self.durable / str(fid)
        size = os.fstat(fd).st_size
        durable = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)  # pwrite: no append
        try:
            for start, end in self.dirty.pop(fid, ()):
                for at in range(start, min(end, size), COPY):
                    data = os.pread(fd, min(COPY, min(end, size) - at), at)
                    os.pwrite(durable, data, at)
            os.truncate(durable, size)
        finally:
            os.close(durable)
        found = os.fstat(fd)
        kind = self.kinds.get(fid, ("file", found.st_mode, 0, 0, None))
        self.kinds[fid] = ("file", found.st_mode, found.st_uid, found.st_gid, kind[4])

    def written(self, fid, start, end):
        ranges = self.dirty.setdefault(fid, [])
        if ranges and ranges[-1][1] == start:  # appends, as a log writes: one range
            ranges[-1][1] = end
        elif start < end:
            ranges.append([start, end])

    def cut(self):
        """Put live back to its durable state. Every file must be closed."""
        with self.mutex:
            if self.handles:
                return f"cut refused: {len(self.handles)} files are open"
            for name in os.listdir(self.live):  # live may be a mount point: its content
                child = self.live / name
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            made = {}  # file id: its first live path (a second name is a hard link)
            self.rebuild(self.root, str(self.live), made)
            self.ids.clear()
            self.dirty.clear()
            for fid, live_path in made.items():  # the same ids, on the new inodes
                self.ids[os.lstat(live_path).st_ino] = fid
            self.ids[os.lstat(self.live).st_ino] = self.root
            for fid in set(os.listdir(self.durable)) - {str(fid) for fid in made}:
                os.unlink(self.durable / fid)  # content no durable entry names
            return "cut done"

    def rebuild(self, dir_id, live_folder, made):
        for name, fid in self.entries.get(dir_id, {}).items():
            child = os.path.join(live_folder, name)
            kind, mode, uid, gid, target = self.kinds[fid]
            if fid in made:
                os.link(made[fid], child)
                continue
            if kind == "dir":
                os.mkdir(child)
                self.rebuild(fid, child, made)
            elif kind == "link":
                os.symlink(target, child)
            else:
                source = self.durable / str(fid)
                if source.exists():
                    shutil.copyfile(source, child)
                else:  # its entry was synced, never its content
                    Path(child).touch()
            made[fid] = child
            os.lchown(child, uid, gid)
            if kind != "link":
                os.chmod(child, stat.S_IMODE(mode))

    # -- the operations, on live at once --

    def init_with_config(self, _conn, config):
        if config:
            config.entry_timeout = config.attr_timeout = CACHED
            config.negative_timeout = CACHED
        print("mounted", flush=True)

    def getattr(self, path, fh=None):
        found = os.fstat(fh) if fh is not None else os.lstat(self.path(path))
        return {
            key: getattr(found, key)
            for key in (
                "st_mode",
                "st_nlink",
                "st_uid",
                "st_gid",
                "st_size",
                "st_blocks",
                "st_ino",
            )
        } | {
            "st_atime": found.st_atime_ns,
            "st_mtime": found.st_mtime_ns,
            "st_ctime": found.st_ctime_ns,
        }

    def readdir(self, path, _fh):
        return [".", "..", *os.listdir(self.path(path))]

    def readlink(self, path):
        return os.readlink(self.path(path))

    def statfs(self, path):
        found = os.statvfs(self.path(path))
        return {
            key: getattr(found, key)
            for key in (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
        }

    def _owned(self, live_path):
        """A new entry is its caller's, not the daemon's (root)."""
        from mfusepy import fuse_get_context  # noqa: PLC0415 (the daemon's alone)

        uid, gid, _ = fuse_get_context()
        os.lchown(live_path, uid, gid)

    @staticmethod
    def _flags(flags):
        # read-write always (SQLite's -shm, mapped, dies of SIGBUS on a write-only
        # handle); the kernel gives each write its offset, and a truncate as its own
        # call, which is seen as a write
        drop = os.O_ACCMODE | os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL
        return (flags & ~drop) | os.O_RDWR

    def create(self, path, mode, flags):
        with self.mutex:
            live_path = self.path(path)
            fd = os.open(live_path, self._flags(flags) | os.O_CREAT | os.O_EXCL, mode)
            self._owned(live_path)
            self.handles[fd] = self.id_of(live_path)
            return fd

    def open(self, path, flags):
        with self.mutex:
            live_path = self.path(path)
            fd = os.open(live_path, self._flags(flags))
            self.handles[fd] = self.id_of(live_path)
            return fd

    def read(self, _path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, _path, data, offset, fh):
        with self.mutex:
            written = os.pwrite(fh, data, offset)
            self.written(self.handles[fh], offset, offset + written)
            return written

    def truncate(self, path, length, _fh=None):
        with self.mutex:
            live_path = self.path(path)
            before = os.lstat(live_path).st_size
            os.truncate(live_path, length)
            fid = self.id_of(live_path)
            self.written(fid, min(before, length), max(before, length))

    def fallocate(self, _path, mode, offset, size, fh):
        if mode:
            raise OSError(errno.EOPNOTSUPP, "only mode 0")
        with self.mutex:
            os.posix_fallocate(fh, offset, size)
            self.written(self.handles[fh], offset, offset + size)

    def fsync(self, _path, _datasync, fh):
        with self.mutex:
            self.sync_data(self.handles[fh], fh)

    def fsyncdir(self, path, _datasync, _fh):
        with self.mutex:
            self.sync_entries(self.path(path))

    def flush(self, _path, _fh):
        return 0

    def release(self, _path, fh):
        with self.mutex:
            self.handles.pop(fh, None)
            os.close(fh)

    def mkdir(self, path, mode):
        with self.mutex:
            os.mkdir(self.path(path), mode)
            self._owned(self.path(path))

    def mknod(self, path, mode, dev):
        with self.mutex:
            os.mknod(self.path(path), mode, dev)
            self._owned(self.path(path))

    def symlink(self, target, source):
        with self.mutex:
            os.symlink(source, self.path(target))
            self._owned(self.path(target))

    def link(self, target, source):
        with self.mutex:
            os.link(self.path(source), self.path(target))

    def unlink(self, path):
        with self.mutex:
            found = os.lstat(self.path(path))
            os.unlink(self.path(path))
            if found.st_nlink == 1:  # gone from live: its inode number may come back
                self.ids.pop(found.st_ino, None)

    def rmdir(self, path):
        with self.mutex:
            found = os.lstat(self.path(path))
            os.rmdir(self.path(path))
            self.ids.pop(found.st_ino, None)

    def rename(self, old, new):
        with self.mutex:
            with contextlib.suppress(FileNotFoundError):
                replaced = os.lstat(self.path(new))
                if replaced.st_nlink == 1 and not stat.S_ISDIR(replaced.st_mode):
                    self.ids.pop(replaced.st_ino, None)
            os.rename(self.path(old), self.path(new))

    def chmod(self, path, mode):
        os.chmod(self.path(path), mode)

    def chown(self, path, uid, gid):
        os.lchown(self.path(path), uid, gid)

    def utimens(self, path, times=None):
        os.utime(self.path(path), ns=times, follow_symlinks=False)

    def access(self, path, amode):
        if not os.access(self.path(path), amode):
            raise OSError(errno.EACCES, "access")


def serve(live, durable, mount):
    """The daemon: mount, answer commands on stdin, until unmounted or stdin ends."""
    import mfusepy  # noqa: PLC0415 (the daemon's alone: the checker needs none)

    model = Model(live, durable)

    def commands():
        for line in sys.stdin:
            if line.strip() == "cut":
                print(model.cut(), flush=True)
        # the controller is gone: unmount, as the fixture would
        subprocess.run(["fusermount3", "-u", "-z", mount], capture_output=True)

    threading.Thread(target=commands, daemon=True).start()
    mfusepy.FUSE(
        model,
        mount,
        foreground=True,
        allow_other=True,
        default_permissions=True,
        fsname="lazyfs",
    )


# ---- The controller: a mount for a block, cut on demand, always unmounted ----


def users(mount):
    """The processes with a file, a mapping or their folder under mount."""
    prefix, found = str(mount).rstrip("/") + "/", set()
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if int(proc.name) == os.getpid():
                continue
            places = [os.readlink(proc / "cwd")]
            places += [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            places += [
                line.split(None, 5)[-1]
                for line in (proc / "maps").read_text().splitlines()
                if len(line.split(None, 5)) == 6
            ]
            if any((place + "/").startswith(prefix) for place in places):
                found.add(int(proc.name))
    return found


class LazyFS:
    """The daemon on folder/mount, over folder/live (or `live`, a folder of the
    caller's, say on a tmpfs), for a `with` block; unmounted at its end, whatever
    happened."""

    def __init__(self, folder, live=None):
        self.folder = Path(folder)
        self.mount = self.folder / "mount"
        self.live = Path(live) if live else self.folder / "live"
        self.daemon = None

    def __enter__(self):
        for made in self.mount, self.live:
            made.mkdir(parents=True, exist_ok=True)
        self.mount.chmod(0o755)
        with open(self.folder / "lazyfs.log", "a") as log:
            self.daemon = subprocess.Popen(
                [sys.executable, __file__, "serve", self.live, self.folder / "durable"]
                + [self.mount],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        try:
            if self.daemon.stdout.readline() != "mounted\n":
                raise RuntimeError(f"lazyfs did not mount: {self.log()}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def log(self):
        with contextlib.suppress(OSError):
            return (self.folder / "lazyfs.log").read_text()[-2000:]
        return ""

    def cut(self, spare=()):
        """A power cut: SIGKILL every process using the filesystem (but `spare`,
        already dead or stopped by the caller), then drop what was not synced. Return
        the processes killed."""
        killed = users(self.mount) - set(spare)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + WAIT
        while users(self.mount) - set(spare):
            if time.monotonic() > deadline:
                raise RuntimeError(f"users outlive SIGKILL: {users(self.mount)}")
            time.sleep(0.02)
        # pages a mapping left dirty reach the daemon now, as writes never synced
        subprocess.run(["sync", "-f", str(self.mount)], check=False, timeout=WAIT)
        while True:
            self.daemon.stdin.write("cut\n")
            self.daemon.stdin.flush()
            said = self.daemon.stdout.readline()
            if said == "cut done\n":
                time.sleep(CACHED + 0.1)  # what the kernel knew of the past is gone
                return killed
            if not said.startswith("cut refused") or time.monotonic() > deadline:
                raise RuntimeError(f"lazyfs: {said.strip()} {self.log()}")
            time.sleep(0.05)  # the kernel releases a killed process's files soon after

    def __exit__(self, *_exc):
        """Unmount, even after a failure: lazily if a user still holds it."""
        for options in (["-u"], ["-u", "-z"]):
            unmounted = subprocess.run(
                ["fusermount3", *options, str(self.mount)],
                check=False,
                capture_output=True,
                timeout=WAIT,
            )
            if unmounted.returncode == 0 or not os.path.ismount(self.mount):
                break
        if self.daemon:
            with contextlib.suppress(OSError):
                self.daemon.stdin.close()
            try:
                self.daemon.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
            self.daemon.stdout.close()


def sweep(prefix):
    """Unmount the lazyfs mounts under folders named `prefix`* of processes that are
    gone (a run killed before it could)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if fields[0] == "lazyfs" and f"/{prefix}" in fields[1]:
                subprocess.run(
                    ["fusermount3", "-u", "-z", fields[1]], check=False, timeout=WAIT
                )


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 5:
        sys.exit(__doc__)
    serve(*sys.argv[2:])
