#!/usr/bin/env python3
"""Fetch the real AMD ROCm libraries and headers from Debian's unstable archive, for CI.

No AMD GPU is needed and nothing on the system changes: apt-get runs with a sources
list, package lists, cache and (empty) dpkg status of its own under the cache folder,
downloads the packages there (``apt-get download``), and they are unpacked into a
folder of the cache, never into ``/``. The libraries need unstable's own loader and
libc (glibc >= 2.38, libstdc++ >= 13), so those come from unstable too; the tests run
a process under that loader (``ld-linux-x86-64.so.2 --library-path LIBDIR python ...``).

Cache: ``$UNIMATMUL_CI_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/unimatmul-ci``, folder
``debian-unstable/`` (``debs/`` the packages, ``root/`` the unpacked tree). A later run
downloads only what changed and unpacks again only when the package set changed.

The archive is the one this machine's apt already uses for its own release (read from
``/etc/apt/sources.list*``), with the suite ``unstable``; ``UNIMATMUL_DEBIAN_ARCHIVE``
names another. If it cannot be reached, or a package is missing, this says so and exits
with status 1: the tier that calls it must fail, never pass on nothing.

The two big packages are unpacked in part: ``librocblas4`` (4 GB unpacked, 3 GB of it
GPU code objects) gives only ``librocblas.so*``, and ``libhipblaslt1`` its library and
its solution tables (``hipblaslt/library/*.dat``) without the code objects. Nothing
here runs GPU code, so nothing reads what is left out.

Usage: ``python3 scripts/fetch_debian_rocm.py`` (standard library only); the last line
of its output is the unpacked root.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: The libraries, their headers, and every library they need at load time
#: (``DT_NEEDED``, recursively; ``tests/amd_real`` checks that each resolves inside the
#: unpacked tree). libamdhip64-6 also depends on libamd-comgr3 (and through it LLVM),
#: which it opens only to compile GPU code: left out.
PACKAGES = (
    "libhipblaslt1",
    "libhipblaslt-dev",
    "librocblas4",
    "librocblas-dev",
    "libhipblas-common-dev",
    "libamdhip64-6",
    "libamdhip64-dev",
    "libhsa-runtime64-1",
    "libroctx64-4",
    "libnuma1",
    "libdrm2",
    "libdrm-amdgpu1",
    "libelf1t64",
    "zlib1g",
    "libzstd1",
    "libstdc++6",
    "libgcc-s1",
    "libc6",
)
#: Package -> the members to unpack (tar wildcards); the others are unpacked whole.
PARTIAL = {
    "librocblas4": ("./usr/lib/x86_64-linux-gnu/librocblas.so*",),
    "libhipblaslt1": (
        "./usr/lib/x86_64-linux-gnu/libhipblaslt.so*",
        "./usr/lib/x86_64-linux-gnu/hipblaslt/library/*.dat",
    ),
}
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
COMPLETE = ".complete"  # in the root: the package files it was unpacked from


class FetchError(RuntimeError):
    """Something the tier needs could not be fetched; the message says what and why."""


def cache_dir() -> Path:
    base = os.environ.get("UNIMATMUL_CI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "unimatmul-ci"
    )
    return Path(base) / "debian-unstable"


def _sources_files() -> list[Path]:
    etc = Path("/etc/apt")
    files = [etc / "sources.list"] if (etc / "sources.list").is_file() else []
    parts = etc / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    return files


def system_archive() -> str:
    """The URI of the Debian archive this machine's apt uses for its own release (main)."""
    explicit = os.environ.get("UNIMATMUL_DEBIAN_ARCHIVE", "").strip()
    if explicit:
        return explicit
    codename = ""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                codename = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    for path in _sources_files():
        text = path.read_text(errors="replace")
        if path.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(
                    (m.group(1).lower(), m.group(2).strip())
                    for m in re.finditer(r"^([A-Za-z-]+):[ \t]*(.*)$", stanza, re.M)
                )
                suites = fields.get("suites", "").split()
                if "deb" in fields.get("types", "").split() and codename in suites and fields.get("uris"):
                    return fields["uris"].split()[0]
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == codename:
                    return words[1]
    msg = (
        f"no Debian archive for this release ({codename or 'unknown'}) in /etc/apt/sources.list*; "
        "set UNIMATMUL_DEBIAN_ARCHIVE to the archive's URI"
    )
    raise FetchError(msg)


def _apt_options(cache: Path) -> list[str]:
    options = {
        "Dir::Etc::sourcelist": cache / "etc" / "sources.list",
        # Empty folders: none of the system's sources or pins apply.
        "Dir::Etc::sourceparts": cache / "etc" / "sources.list.d",
        "Dir::Etc::preferencesparts": cache / "etc" / "preferences.d",
        "Dir::Etc::preferences": cache / "etc" / "preferences",
        "Dir::State::Lists": cache / "lists",
        "Dir::State::status": cache / "status",
        "Dir::Cache": cache / "cache",
        "APT::Architecture": "amd64",
        "APT::Architectures": "amd64",
        "Acquire::Languages": "none",
        # Root runs this in CI; the _apt user could not write into root's cache.
        "APT::Sandbox::User": "root",
    }
    return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        msg = f"{what} failed (exit {proc.returncode}): {' '.join(cmd[:1] + cmd[-3:])}\n{proc.stdout}{proc.stderr}"
        raise FetchError(msg)
    return proc.stdout


def update(cache: Path, archive: str) -> None:
    for sub in ("etc/sources.list.d", "etc/preferences.d", "lists/partial", "cache/archives/partial", "debs"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    (cache / "status").touch()
    (cache / "etc" / "sources.list").write_text(f"deb [signed-by={KEYRING}] {archive} unstable main\n")
    proc = subprocess.run(["apt-get", *_apt_options(cache), "update"], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    # apt-get update can exit 0 when the archive could not be reached (Err:/W: lines).
    unreachable = re.search(r"^(Err:|W: Failed to fetch|E: )", out, re.M)
    if proc.returncode != 0 or unreachable or not list((cache / "lists").glob("*unstable*Packages*")):
        raise FetchError(f"apt-get update could not get {archive} unstable (exit {proc.returncode}):\n{out}")


def package_files(cache: Path) -> dict[str, str]:
    """Package -> the file name ``apt-get download`` saves it as (from the package lists)."""
    out = _run(
        ["apt-cache", *_apt_options(cache), "show", "--no-all-versions", *PACKAGES],
        "apt-cache show (is every package still in unstable?)",
    )
    files: dict[str, str] = {}
    for stanza in out.split("\n\n"):
        fields = dict(re.findall(r"^(Package|Version|Architecture): (.*)$", stanza, re.M))
        if len(fields) == 3:
            # As apt-get download names it: an epoch's colon is written %3a.
            version = fields["Version"].replace(":", "%3a")
            files[fields["Package"]] = f"{fields['Package']}_{version}_{fields['Architecture']}.deb"
    missing = [p for p in PACKAGES if p not in files]
    if missing:
        raise FetchError(f"not in unstable any more: {', '.join(missing)}")
    return files


def download(cache: Path, files: dict[str, str]) -> int:
    """Download what is not in ``debs/`` yet; drop older versions. Bytes downloaded."""
    debs = cache / "debs"
    wanted = set(files.values())
    for old in debs.glob("*.deb"):
        if old.name not in wanted:
            old.unlink()
    todo = [p for p, f in files.items() if not (debs / f).is_file()]
    if todo:
        _run(["apt-get", *_apt_options(cache), "download", *todo], "apt-get download", cwd=debs)
    absent = [f for f in wanted if not (debs / f).is_file()]
    if absent:
        raise FetchError(f"apt-get download did not save {', '.join(sorted(absent))}")
    return sum((debs / files[p]).stat().st_size for p in todo)


def unpack(cache: Path, files: dict[str, str]) -> Path:
    """Unpack into ``root/`` (a fresh folder, then renamed) unless it holds these files."""
    root = cache / "root"
    stamp = "\n".join(sorted(files.values())) + "\n"
    if (root / COMPLETE).is_file() and (root / COMPLETE).read_text() == stamp:
        return root
    fresh = cache / "root.new"
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    for package, name in sorted(files.items()):
        deb = str(cache / "debs" / name)
        members = PARTIAL.get(package)
        if members is None:
            _run(["dpkg", "-x", deb, str(fresh)], f"dpkg -x {name}")
            continue
        # dpkg -x is dpkg-deb --fsys-tarfile into tar -x; this is the same with a member list.
        tar = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", deb], stdout=subprocess.PIPE)
        extract = subprocess.run(
            ["tar", "-x", "-C", str(fresh), "--wildcards", *members], stdin=tar.stdout, capture_output=True
        )
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or extract.returncode != 0:
            raise FetchError(f"unpacking {name} failed: {extract.stderr.decode(errors='replace')}")
    (fresh / COMPLETE).write_text(stamp)
    shutil.rmtree(root, ignore_errors=True)
    fresh.rename(root)
    return root


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    cache = cache_dir()
    start = time.monotonic()
    try:
        archive = system_archive()
        print(f"fetch_debian_rocm: archive {archive} unstable, cache {cache}", flush=True)
        update(cache, archive)
        t_update = time.monotonic()
        files = package_files(cache)
        fetched = download(cache, files)
        t_download = time.monotonic()
        root = unpack(cache, files)
        t_unpack = time.monotonic()
    except (FetchError, OSError) as exc:
        bar = "=" * 78
        print(
            f"{bar}\nFAILED: the real ROCm packages from Debian unstable could not be had:\n{exc}\n{bar}",
            file=sys.stderr,
        )
        return 1
    debs = sum((cache / "debs" / f).stat().st_size for f in files.values())
    print(
        f"fetch_debian_rocm: {len(files)} packages, {debs / 1e6:.0f} MB of .deb "
        f"({fetched / 1e6:.0f} MB downloaded now), unpacked {_size(root) / 1e6:.0f} MB; "
        f"update {t_update - start:.1f} s, download {t_download - t_update:.1f} s, "
        f"unpack {t_unpack - t_download:.1f} s"
    )
    for package in ("libhipblaslt1", "librocblas4", "libamdhip64-6", "libc6"):
        print(f"fetch_debian_rocm:   {files[package]}")
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
