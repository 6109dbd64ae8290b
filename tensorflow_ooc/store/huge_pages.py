"""Uncompressed chunk files mapped on 2 MiB pages where the kernel can map them so.

Linux maps a file's page cache with one PMD entry per 2 MiB (no 4 KiB page-table entries, one TLB
entry) where the cache holds the range as one 2 MiB folio and the mapping is 2 MiB-aligned
(file systems with large folios: ext4 from Linux 6.16, XFS). A buffered write of a whole chunk
file leaves such folios; a cold fault on a mapping advised ``MADV_HUGEPAGE`` reads them in; but
pages faulted in through an unadvised mapping, or ``read()``, stay 4 KiB (or small) folios until
dropped. A streamed all-mode MTTKRP from mode-sorted copies on 4 KiB pages took a third more
time than on 2 MiB pages (vast-shaped, one thread; docs/KERNELS.md, "2 MiB pages").

:func:`map_private` therefore advises every mapping, and on the first mapping of a file version in
a process (``fresh``; the CRC32C check then reads every page anyway) probes whether it is mapped on
2 MiB pages; where not, it drops the file's clean cached pages (``POSIX_FADV_DONTNEED``; pages
another process maps stay) and maps it again, so the check's faults read it back as 2 MiB folios.
"""

from __future__ import annotations

import mmap
import os
from functools import cache

import numpy as np

_PAGE = mmap.PAGESIZE
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_PRESENT = np.uint64(1 << 63)  # /proc/PID/pagemap: the page is mapped (readable without privileges)
#: drops that did not give 2 MiB pages before a process stops dropping (a kernel or file system
#: without large folios: every drop would only cost a read from disk)
MAX_FUTILE_DROPS = 4
#: whether a fresh mapping found on small pages is dropped and read back (benchmarks turn it off
#: to time a cache left on 4 KiB pages)
DROP_SMALL_PAGES = True
_drops = {"done": 0, "paid": 0}


@cache
def pmd_bytes() -> int:
    """The bytes one PMD entry maps where transparent huge pages may serve advised mappings, else 0
    (THP ``never``, not Linux)."""
    base = "/sys/kernel/mm/transparent_hugepage/"
    try:
        with open(base + "enabled") as f:
            if "[never]" in f.read():
                return 0
        with open(base + "hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def advise(mm: mmap.mmap) -> None:
    """``MADV_HUGEPAGE`` on a mapping: its cold faults read 2 MiB folios (kernels that refuse it
    map as before)."""
    if _MADV_HUGEPAGE is not None:
        try:
            mm.madvise(_MADV_HUGEPAGE)
        except OSError:
            pass


def pmd_mapped(mm: mmap.mmap) -> bool | None:
    """Whether each whole 2 MiB range of a fresh mapping is mapped on one 2 MiB page: touches the
    first byte of each and reads ``/proc/self/pagemap`` (a fault maps a 2 MiB folio whole, 4 KiB
    pages 16 at a time). None where it cannot tell: no THP, a mapping shorter than 2 MiB or not
    2 MiB-aligned, no pagemap."""
    pmd = pmd_bytes()
    if not pmd or len(mm) < pmd:
        return None
    addr = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    if addr % pmd:
        return None
    per = pmd // _PAGE
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return None
    try:
        for off in range(0, len(mm) - pmd + 1, pmd):
            mm[off]  # fault the range in
            entries = np.frombuffer(os.pread(fd, 8 * per, ((addr + off) // _PAGE) * 8), dtype=np.uint64)
            if entries.shape[0] != per or not np.all(entries & _PRESENT):
                return False
    except OSError:
        return None
    finally:
        os.close(fd)
    return True


def _map(fd: int) -> mmap.mmap:
    # private and writable (copy-on-write; nothing writes): the kernels are compiled for writable arrays
    mm = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    advise(mm)
    return mm


def map_private(fd: int, fresh: bool) -> mmap.mmap:
    """A private, writable mapping of the open file ``fd`` (not empty), advised ``MADV_HUGEPAGE``;
    with ``fresh``, a file whose cache is not in 2 MiB folios is dropped from the cache first (see
    the module's docstring)."""
    mm = _map(fd)
    futile = _drops["done"] >= MAX_FUTILE_DROPS and not _drops["paid"]
    if not fresh or not DROP_SMALL_PAGES or futile or not hasattr(os, "posix_fadvise"):
        return mm
    if pmd_mapped(mm) is not False:
        return mm
    mm.close()
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    mm = _map(fd)
    _drops["done"] += 1
    _drops["paid"] += bool(pmd_mapped(mm))
    return mm
