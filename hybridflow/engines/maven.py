"""A Maven repository over HTTP, read with the standard library: an artifact's compile dependencies from
its POM, and a file downloaded with the checksum the repository publishes beside it, so that only bytes
the repository vouches for ever leave the download folder."""

from __future__ import annotations

import base64
import hashlib
import http.client
import re
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

CENTRAL = "https://repo1.maven.org/maven2/"
CHECKSUMS = ("sha512", "sha256", "sha1")  # the strongest the repository publishes (older artifacts: sha1 only)
CHUNK = 1 << 20
TIMEOUT_SECONDS = 60  # per connect and per read, not per file: a 690 MB jar takes as long as it takes
PARENTS_AT_MOST = 10  # a POM's chain of parents (hadoop-aws has two)


class RepositoryError(Exception):
    """A repository that cannot be reached, lacks a file, or serves bytes its checksum disowns. The
    message names the repository by its host only (a mirror's URL may carry a user and token)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status the repository answered, if it answered


@dataclass(frozen=True)
class Artifact:
    group: str
    name: str
    version: str
    classifier: str = ""  # a variant published beside the main jar ("shaded": its dependencies inside)

    def path(self, extension: str) -> str:
        """The file's path in a repository; a classifier names a jar variant, never the POM."""
        folder = f"{self.group.replace('.', '/')}/{self.name}/{self.version}"
        return f"{folder}/{self.jar if extension == 'jar' else f'{self.name}-{self.version}.{extension}'}"

    @property
    def jar(self) -> str:
        return f"{self.name}-{self.version}{f'-{self.classifier}' if self.classifier else ''}.jar"


class Repository:
    """`url`: the repository's root (https://user:token@host/path/ works: the user and token go in an
    Authorization header, never in a message). A download cut off part way is resumed where it stopped
    (an HTTP range), up to `retries` times, `backoff` seconds apart and doubling."""

    def __init__(self, url: str, retries: int = 3, backoff: float = 2.0) -> None:
        parts = urlsplit(url.rstrip("/") + "/")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RepositoryError(f"not an http(s) URL: {parts.scheme or 'no scheme'}://{parts.hostname or ''}")
        self.host = parts.hostname + (f":{parts.port}" if parts.port else "")
        self.root = urlunsplit((parts.scheme, self.host, parts.path, "", ""))
        self.headers = {"User-Agent": "hybridflow"}
        if parts.username is not None:
            secret = f"{parts.username}:{parts.password or ''}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(secret).decode()
        self.retries, self.backoff = retries, backoff

    def _open(self, path: str, start: int = 0):
        headers = {**self.headers, **({"Range": f"bytes={start}-"} if start else {})}
        request = urllib.request.Request(self.root + path, headers=headers)
        try:
            return urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS)  # noqa: S310 (http(s) only, above)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise RepositoryError(f"{self.host} answered {exc.code} {exc.reason} for {path}", exc.code) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise RepositoryError(f"cannot reach {self.host}: {_reason(exc)}") from None

    def read(self, path: str) -> bytes:
        """A small file (a POM, a checksum), whole."""
        with self._open(path) as answer:
            try:
                return answer.read()
            except (OSError, http.client.HTTPException) as exc:
                raise RepositoryError(f"{self.host} broke off {path}: {_reason(exc)}") from None

    def published_checksum(self, path: str) -> tuple[str, str]:
        """(algorithm, hex digest) of the strongest checksum the repository publishes for `path`."""
        for algorithm in CHECKSUMS:
            try:
                text = self.read(f"{path}.{algorithm}").decode("ascii", "replace")
            except RepositoryError as exc:
                if exc.status == 404:
                    continue
                raise
            digest = text.split()[0].lower() if text.split() else ""  # some add "  file-name"
            if re.fullmatch(r"[0-9a-f]{%d}" % (hashlib.new(algorithm).digest_size * 2), digest):
                return algorithm, digest
            raise RepositoryError(f"{self.host} serves no valid {algorithm} checksum for {path}")
        raise RepositoryError(f"{self.host} publishes no checksum ({', '.join(CHECKSUMS)}) for {path}")

    def verified(self, path: str) -> bytes:
        """A small file, whole, once its checksum matches."""
        algorithm, expected = self.published_checksum(path)
        data = self.read(path)
        _check(hashlib.new(algorithm, data).hexdigest(), expected, algorithm, path, self.host)
        return data

    def download(self, path: str, target: Path, progress: Callable[[int, int | None], None]) -> None:
        """`path` into the file `target` (created), once its checksum matches; else the file is left
        for the caller to delete. `progress(bytes so far, total or None)` follows the download."""
        algorithm, expected = self.published_checksum(path)
        with open(target, "w+b") as out:
            for attempt in range(self.retries + 1):
                try:
                    self._receive(path, out, progress)
                    break
                except RepositoryError:
                    if attempt == self.retries:
                        raise
                    time.sleep(self.backoff * 2 ** attempt)
            out.seek(0)
            digest = hashlib.file_digest(out, algorithm)  # of what is on disk, resumed or not
        _check(digest.hexdigest(), expected, algorithm, path, self.host)

    def _receive(self, path: str, out, progress) -> None:
        """The rest of `path`, from the byte `out` holds up to, appended to `out`."""
        done = out.tell()
        with self._open(path, start=done) as answer:
            if done and answer.status != 206:  # the range was ignored: the whole file again
                out.seek(0)
                out.truncate()
                done = 0
            length = answer.headers.get("Content-Length")  # of what is left
            total = done + int(length) if length and length.isdigit() else None
            progress(done, total)
            while True:
                try:
                    chunk = answer.read(CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise RepositoryError(f"{self.host} broke off {path} after {done} bytes: {_reason(exc)}") from None
                if not chunk:
                    break
                out.write(chunk)
                done += len(chunk)
                progress(done, total)
        if total is not None and done != total:  # http.client ends a cut-off body quietly
            raise RepositoryError(f"{self.host} broke off {path} after {done} of {total} bytes")


def _check(actual: str, expected: str, algorithm: str, path: str, host: str) -> None:
    if actual != expected:
        raise RepositoryError(f"{path} from {host} does not match its published {algorithm} "
                              f"(got {actual[:12]}…, expected {expected[:12]}…)")


def _reason(exc: BaseException) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return str(reason) or type(reason).__name__


def compile_dependencies(repository: Repository, artifact: Artifact) -> list[Artifact]:
    """The artifacts `artifact` needs at run time that its POM declares in compile scope (neither
    optional, nor provided, test or runtime), each version taken from the POM or, where it leaves it to
    its parents, from their dependencyManagement, with ${properties} filled in. Their own dependencies
    are not followed: enough for hadoop-aws, which excludes every dependency of the SDK bundle."""
    chain = _pom_chain(repository, artifact)
    properties = {"project.version": artifact.version, "version": artifact.version,
                  "project.groupId": artifact.group}
    managed: dict[tuple[str, str], str] = {}
    for pom in reversed(chain):  # the POM's own values win over its parents'
        properties.update({p.tag: (p.text or "").strip() for p in pom.findall("properties/*")})
        managed.update({(_text(d, "groupId"), _text(d, "artifactId")): _text(d, "version")
                        for d in pom.findall("dependencyManagement/dependencies/dependency")})
    parent = chain[0].find("parent")
    if parent is not None:
        properties.setdefault("project.parent.version", _text(parent, "version"))
    needed = []
    for dependency in (d for pom in chain for d in pom.findall("dependencies/dependency")):
        if (_text(dependency, "scope") or "compile") != "compile" or _text(dependency, "optional") == "true" \
                or (_text(dependency, "type") or "jar") != "jar" or _text(dependency, "classifier"):
            continue
        group, name = _text(dependency, "groupId"), _text(dependency, "artifactId")
        version = _text(dependency, "version") or managed.get((group, name), "")
        needed.append(Artifact(_filled(group, properties), _filled(name, properties),
                               _filled(version, properties, f"{group}:{name} in {artifact.name}'s POM")))
    return list(dict.fromkeys(needed))


def _pom_chain(repository: Repository, artifact: Artifact) -> list[ET.Element]:
    """The artifact's POM, then its parent's, and so on up."""
    chain, at = [], artifact
    while at is not None and len(chain) < PARENTS_AT_MOST:
        path = at.path("pom")
        try:
            pom = _without_namespaces(ET.fromstring(repository.verified(path)))
        except ET.ParseError as exc:
            raise RepositoryError(f"{path} from {repository.host} is not XML: {exc}") from None
        chain.append(pom)
        parent = pom.find("parent")
        at = Artifact(_text(parent, "groupId"), _text(parent, "artifactId"), _text(parent, "version")) \
            if parent is not None else None
    return chain


def _filled(text: str, properties: dict[str, str], what: str = "") -> str:
    for _ in range(PARENTS_AT_MOST):  # a property may name another
        filled = re.sub(r"\$\{([^}]+)\}", lambda m: properties.get(m.group(1), m.group(0)), text)
        if filled == text:
            break
        text = filled
    if not text or "${" in text:
        raise RepositoryError(f"cannot tell the version of {what or text}: {text or 'none given'}")
    return text


def _text(element: ET.Element, tag: str) -> str:
    return (element.findtext(tag) or "").strip()


def _without_namespaces(root: ET.Element) -> ET.Element:
    for element in root.iter():
        if isinstance(element.tag, str) and "}" in element.tag:
            element.tag = element.tag.split("}", 1)[1]
    return root
