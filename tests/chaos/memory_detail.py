"""Where a chaos worker's resident memory went (issue 40): a breakdown taken
only when CHAOS_MEMORY_DETAIL=1 asks for it (benchmarks/chaos.py
--memory-detail), to find what a step in a worker's RSS was.

Two halves, each read at the round's memory sample:
  - the harness reads the worker's /proc/<pid>/smaps: resident kB by
    mapping (the [heap], each anonymous mapping by its range, each file);
  - where gdb and glibc's debug symbols are there, which of the worker's
    threads use which glibc arena (each thread's `thread_arena`; gdb
    attaches for ~0.2 s, loading libc's symbols only);
  - the worker itself, after every step, writes what only it can see to
    <dir>/<pid>.json: glibc's arenas (malloc_info: each arena's system
    bytes, the mmapped chunks), CPython's obmalloc arenas
    (_PyObject_DebugMallocStats) and allocated blocks, its threads by name,
    and the objects the garbage collector tracks.

Nothing here runs in a worker unless the variable is set.
"""
import ctypes
import gc
import json
import os
import re
import shutil
import subprocess
import sys

ENV = "CHAOS_MEMORY_DETAIL"


def _libc():
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return libc


def _to_file(libc, path, write):
    """Runs write(FILE*) into `path` and returns what it wrote."""
    fp = libc.fopen(path.encode(), b"w")
    try:
        write(fp)
    finally:
        libc.fclose(fp)
    with open(path) as f:
        return f.read()


def _malloc(xml):
    """glibc's malloc_info: system bytes per arena, and the mmapped chunks."""
    arenas = [int(m.group(1)) for m in re.finditer(
        r'<heap nr="\d+">.*?<system type="current" size="(\d+)"/>', xml, re.S)]
    mmap = re.search(r'<total type="mmap" count="(\d+)" size="(\d+)"/>', xml)
    return {"arenas": len(arenas), "arena_kb": [a // 1024 for a in arenas],
            "mmap_chunks": int(mmap.group(1)) if mmap else None,
            "mmap_kb": int(mmap.group(2)) // 1024 if mmap else None}


def _obmalloc(text):
    """CPython's small-object allocator: arenas (1 MiB each in 3.11)."""
    out = {}
    for key, name in (("arenas_current", "# arenas allocated current"),
                      ("arenas_highwater", "# arenas highwater mark"),
                      ("arenas_total", "# arenas allocated total")):
        m = re.search(re.escape(name) + r"\s*=\s*([\d,]+)", text)
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out


def _threads():
    names = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return names


class Recorder:
    """The worker's half: ``record(step)`` writes its breakdown."""

    def __init__(self, directory):
        self.path = os.path.join(directory, f"{os.getpid()}.json")
        self.scratch = self.path + ".txt"
        self.libc = _libc()
        self.stats = ctypes.pythonapi._PyObject_DebugMallocStats
        self.stats.argtypes = [ctypes.c_void_p]

    def record(self, step):
        detail = {"step": step,
                  "malloc": _malloc(_to_file(self.libc, self.scratch,
                                             lambda fp: self.libc.malloc_info(0, fp))),
                  "obmalloc": _obmalloc(_to_file(self.libc, self.scratch, self.stats)),
                  "blocks": sys.getallocatedblocks(),
                  "gc_objects": len(gc.get_objects()),
                  "threads": _threads()}
        with open(self.path + ".tmp", "w") as f:
            json.dump(detail, f)
        os.replace(self.path + ".tmp", self.path)


def recorder():
    """A Recorder when CHAOS_MEMORY_DETAIL names a directory, else None."""
    directory = os.environ.get(ENV)
    return Recorder(directory) if directory else None


# -- the harness's half ----------------------------------------------------

def smaps(pid):
    """{mapping: resident kB} of process `pid` (mappings holding none left
    out); an anonymous mapping is named by its range."""
    out, key = {}, None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):
                    parts = line.split()
                    key = parts[5] if len(parts) > 5 else f"anon {parts[0]}"
                    if key.startswith("/"):
                        key = f"{key} {parts[1]}"     # a file's r-x, rw- ... parts
                elif first == "Rss:" and key is not None:
                    kb = int(line.split()[1])
                    if kb:
                        out[key] = out.get(key, 0) + kb
    except OSError:
        return None
    return out


# A non-main glibc arena lives at the start of its heap, which is aligned to
# HEAP_MAX_SIZE (64 MiB on 64-bit), so the arena names its mapping.
_HEAP_MAX = 64 << 20


def arena_threads(pid):
    """{mapping start (hex, as in smaps) or "[heap]": sorted thread names}
    for each glibc arena a thread of `pid` uses now; {} without gdb."""
    gdb = shutil.which("gdb")
    if not gdb:
        return {}
    try:
        out = subprocess.run(
            [gdb, "-p", str(pid), "-batch", "-nx", "-iex", "set auto-solib-add off",
             "-ex", "sharedlibrary libc.so", "-ex", "thread apply all p (void*)thread_arena"],
            capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    owners, name = {}, None
    for line in out.splitlines():
        m = re.match(r'Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP \d+\) "([^"]*)"\)', line)
        if m:
            name = m.group(1)
            continue
        m = re.match(r"\$\d+ = \(void \*\) (0x[0-9a-f]+)( <main_arena>)?", line)
        if m and name is not None:
            addr = int(m.group(1), 16)
            if addr:
                key = "[heap]" if m.group(2) else f"{addr & ~(_HEAP_MAX - 1):x}"
                owners.setdefault(key, []).append(name)
            name = None
    return {k: sorted(v) for k, v in owners.items()}


def _owner(key, owners):
    """The threads using the arena of smaps mapping `key`, if any."""
    if key == "[heap]":
        return owners.get("[heap]")
    if key.startswith("anon "):
        return owners.get(key.split()[1].split("-")[0])
    return None


def sample(pid, directory):
    """The breakdown of worker `pid` now: its smaps, its arenas' threads
    and its own record."""
    mine = None
    if directory:
        try:
            with open(os.path.join(directory, f"{pid}.json")) as f:
                mine = json.load(f)
        except (OSError, ValueError):
            pass
    return {"smaps": smaps(pid), "arenas": arena_threads(pid), "worker": mine}


def _diff(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        out = {}
        for k in set(a) | set(b):
            d = _diff(a.get(k, 0), b.get(k, 0))
            if d not in (0, {}, None):
                out[k] = d
        return out
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return b - a
    return None if a == b else [a, b]


def explain(before, after, top=6):
    """What changed between two samples: the mappings whose resident kB
    changed most, and the differences in the worker's own record."""
    sa, sb = before.get("smaps") or {}, after.get("smaps") or {}
    maps = sorted(((sb.get(k, 0) - sa.get(k, 0), k) for k in set(sa) | set(sb)),
                  key=lambda x: -abs(x[0]))
    oa, ob = before.get("arenas") or {}, after.get("arenas") or {}
    out = {"smaps_kb": [[k, d] + ([{"threads_before": _owner(k, oa),
                                    "threads_after": _owner(k, ob)}]
                                  if _owner(k, oa) or _owner(k, ob) else [])
                        for d, k in maps[:top] if d]}
    wa, wb = before.get("worker"), after.get("worker")
    if wa and wb:
        out["worker"] = _diff({k: v for k, v in wa.items() if k != "malloc"},
                              {k: v for k, v in wb.items() if k != "malloc"})
        out["malloc_before"], out["malloc_after"] = wa["malloc"], wb["malloc"]
    return out
