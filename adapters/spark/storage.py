"""Where a SparkTable's source and copy live: file statuses, the versions of the copy, deletion.

A classic SparkSession reaches the storage through Hadoop's FileSystem API in its JVM (no Spark
job: a call per directory and per file). A Spark Connect client has no JVM, so it asks the
server with Spark jobs: the `binaryFile` source lists files with their length and modification
time without reading their content (one job for the source's files and the copy's manifests
together), and a path is deleted by overwriting it with an empty partitioned write, which
removes everything under it and leaves only Spark's `_SUCCESS` marker.

Hadoop paths here are strings such as `file:/tmp/t/part-0.parquet`, `/data/t` or
`s3a://bucket/t`; `DataFrame.inputFiles()` gives URIs, whose escapes `plain_path` undoes.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

# Hadoop's glob characters (a path holding one is read as a pattern unless escaped) and the
# separator of a {a,b} alternative.
GLOB_CHARACTERS = "\\{}[]*?,"


@dataclass(frozen=True)
class FileStatus:
    """One file: its path, length in bytes and modification time (ms since the epoch)."""

    path: str
    size: int
    modified: int


@dataclass(frozen=True)
class Listing:
    """What one look at the storage found: the source's files (in the order asked) and the
    copy's versions, each with the modification time of its manifest (ms), by name."""

    files: tuple[FileStatus, ...]
    versions: dict[str, int]


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def plain_path(uri: str) -> str:
    """A Hadoop path from a URI of `inputFiles()` (`file:///a%20b` -> `file:///a b`)."""
    return urllib.parse.unquote(uri)


def escape_glob(path: str) -> str:
    """`path` with Hadoop's glob characters escaped, so that a reader takes it literally."""
    return "".join("\\" + c if c in GLOB_CHARACTERS else c for c in path)


def _visible(name: str) -> bool:
    """Files Spark reads as data: not hidden (`_SUCCESS`, `.crc`, `_temporary`)."""
    return not name.startswith(("_", "."))


def version_of(path: str, manifests: str) -> str | None:
    """The version a manifest file belongs to (`.../manifests/version=<name>/part-...`)."""
    marker = manifests.rstrip("/").rsplit("/", 1)[-1] + "/version="
    if marker not in path:
        return None
    name, _, rest = path.split(marker, 1)[1].partition("/")
    if not rest or "/" in rest or not _visible(rest):
        return None
    return name


class Storage:
    """The storage of one session (module docstring)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.connect = is_connect(spark)

    # ----- listing --------------------------------------------------------------------------------
    def look(self, files: list[str], copy: str | None) -> Listing:
        """The statuses of `files` (URIs of inputFiles()) and the versions under `copy`
        (None: not asked). A file that vanished since it was listed is left out."""
        if self.connect:
            return self._look_connect(files, copy)
        statuses = tuple(s for s in (self._status(f) for f in files) if s is not None)
        return Listing(statuses, {} if copy is None else self._versions_classic(copy))

    def versions(self, copy: str) -> dict[str, int]:
        return self.look([], copy).versions

    # classic: Hadoop's FileSystem through the session's JVM
    def _fs_path(self, path: str) -> tuple[Any, Any]:
        jvm = self.spark._jvm
        hadoop = jvm.org.apache.hadoop.fs.Path(path)
        return hadoop.getFileSystem(self.spark._jsc.hadoopConfiguration()), hadoop

    def _status(self, uri: str) -> FileStatus | None:
        jvm = self.spark._jvm
        hadoop = jvm.org.apache.hadoop.fs.Path(jvm.java.net.URI(uri))
        fs = hadoop.getFileSystem(self.spark._jsc.hadoopConfiguration())
        try:
            status = fs.getFileStatus(hadoop)
        except Exception:
            return None  # removed since it was listed: the listing changed anyway
        return FileStatus(uri, int(status.getLen()), int(status.getModificationTime()))

    def _versions_classic(self, copy: str) -> dict[str, int]:
        fs, manifests = self._fs_path(copy.rstrip("/") + "/manifests")
        if not fs.exists(manifests):
            return {}
        found: dict[str, int] = {}
        for entry in fs.listStatus(manifests):
            name = entry.getPath().getName()
            if not (entry.isDirectory() and name.startswith("version=")):
                continue
            for part in fs.listStatus(entry.getPath()):  # visible once its write committed
                if part.isFile() and _visible(part.getPath().getName()):
                    found[name.split("=", 1)[1]] = int(part.getModificationTime())
                    break
        return found

    # Spark Connect: one binaryFile job (length and modification time, no content read)
    def _look_connect(self, files: list[str], copy: str | None) -> Listing:
        paths = [escape_glob(plain_path(f)) for f in files]
        manifests = None if copy is None else copy.rstrip("/") + "/manifests"
        if manifests is not None:
            paths.append(self._manifests_pattern(manifests, files))
        if not paths:
            return Listing((), {})
        try:
            rows = (
                self.spark.read.format("binaryFile")
                .option("recursiveFileLookup", "true")
                .load(paths)
                .select("path", "length", "modificationTime")
                .collect()
            )
        except Exception:
            if manifests is None or not files:
                return Listing((), {})  # no manifests (and no file to anchor the pattern)
            # a source file vanished since it was listed, or no manifests: one at a time
            return Listing(self._look_connect(files, None).files, self.versions(copy or ""))
        by_path: dict[str, FileStatus] = {}
        versions: dict[str, int] = {}
        for row in rows:
            modified = int(row["modificationTime"].timestamp() * 1000)
            status = FileStatus(row["path"], int(row["length"]), modified)
            by_path[_comparable(row["path"])] = status
            if manifests is not None:
                name = version_of(row["path"], manifests)
                if name is not None:
                    versions[name] = modified
        statuses = []
        for f in files:
            found = by_path.get(_comparable(plain_path(f)))
            if found is not None:
                statuses.append(FileStatus(f, found.size, found.modified))
        return Listing(tuple(statuses), versions)

    @staticmethod
    def _manifests_pattern(manifests: str, files: list[str]) -> str:
        """The manifests' directory as a Hadoop pattern that also matches a file known to exist
        (a source file, `{manifests,file}`), so that listing a copy not yet written finds that
        file instead of failing (a failure is logged by the Connect server)."""
        plain = escape_glob(manifests)
        if not files:
            return plain
        head, sep, rest = _split_root(manifests)
        anchor = urllib.parse.urlsplit(files[0])
        anchor_path = urllib.parse.unquote(anchor.path)
        if not sep or not anchor_path.startswith("/") or _braces(rest + anchor_path):
            return plain  # a relative path, or braces (Hadoop expands them despite escapes)
        return f"{head}/{{{escape_glob(rest.lstrip('/'))},{escape_glob(anchor_path.lstrip('/'))}}}"

    # ----- deletion -------------------------------------------------------------------------------
    def delete(self, path: str) -> None:
        """Remove `path` and everything under it (nothing if it does not exist). On Spark
        Connect, an empty partitioned overwrite: only the `_SUCCESS` marker stays (and is
        made where nothing was)."""
        if self.connect:
            empty = self.spark.createDataFrame([], "removed INT, nothing INT")
            empty.write.mode("overwrite").partitionBy("removed").parquet(path)
            return
        fs, hadoop = self._fs_path(path)
        if fs.exists(hadoop):
            fs.delete(hadoop, True)


def _split_root(path: str) -> tuple[str, str, str]:
    """(scheme and authority, "/" if the path is absolute, the path from its root)."""
    parts = urllib.parse.urlsplit(path)
    if parts.scheme and len(parts.scheme) > 1:  # not a Windows drive letter
        slashes = "//" if parts.netloc or "://" in path else ""
        head, rest = f"{parts.scheme}:{slashes}{parts.netloc}", parts.path
    else:
        head, rest = "", path
    return head, "/" if rest.startswith("/") else "", rest


def _braces(path: str) -> bool:
    return "{" in path or "}" in path


def _comparable(path: str) -> str:
    """A path without its scheme's slashes (`file:///a` and `file:/a` name one file)."""
    parts = urllib.parse.urlsplit(path)
    return f"{parts.scheme}:{parts.netloc}:{parts.path}" if parts.scheme else f"::{path}"
